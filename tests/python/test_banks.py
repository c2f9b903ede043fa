#!/usr/bin/env python3
"""Bank-conflict degrees derived by notebooks/models/bank_models.py match what step 05's header claims.

Plain asserts, no pytest: exits non-zero on the first wrong degree. Run as
`python3 tests/python/test_banks.py` (CTest registers it as cpu/python/banks when
numpy is found). Needs numpy only; the figure itself is not drawn.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "notebooks", "models"))
import bank_models  # noqa: E402

# (read degree, store degree, read wavefronts) per layout, for every head_dim step 05 supports.
EXPECTED = {
    "step04": (32, 1, 32),    # lanes head_dim words apart: one bank for the whole warp
    "pad1": (1, 1, 1),        # stride d+1: lane x starts at bank x
    "pad4": (4, 1, 4),        # stride d+4, scalar: lanes x, x+8, x+16, x+24 share a bank
    "pad4_vec4": (1, 1, 4),   # float4: each quarter-warp covers the 32 banks once; 4 wavefronts is the minimum
    "transpose": (1, 32, 1),  # reads consecutive; the store writes a column, Bc words apart
}

for head_dim in (32, 64, 128):
    degrees = bank_models.conflict_degrees(head_dim)
    for layout, (read, store, wavefronts) in EXPECTED.items():
        got = degrees[layout]
        assert (got["read"], got["store"], got["read_wavefronts"]) == (read, store, wavefronts), \
            f"d={head_dim} {layout}: got {got}, expected read {read}, store {store}, wavefronts {wavefronts}"

# The quarter-warp claim directly: 8 lanes of a float4 read cover the 32 banks exactly once.
access = bank_models.read_access("pad4_vec4", 64)
for lanes in access.phases():
    banks = sorted(access.lane_banks()[lanes].ravel())
    assert banks == list(range(32)), f"quarter-warp {lanes[0] // 8} banks {banks}"
# pad4 scalar: the four lanes on bank 0 are 0, 8, 16, 24.
assert list(map(int, (bank_models.read_access("pad4", 64).lane_banks()[:, 0] == 0).nonzero()[0])) == [0, 8, 16, 24]

print("bank-conflict degrees: all as expected for head_dim 32, 64, 128")
