#!/usr/bin/env python3
"""fa_course.torch's custom ops under torch.library.opcheck and torch.compile (issue 33). Needs a GPU and PyTorch.

opcheck tests the ops' registration: the schema, the fake implementations against the real ones, the autograd
registration, and tracing by AOT autograd. Then a function that calls attention_op is compiled whole
(fullgraph=True): its output and gradients must equal the eager call's, bit for bit (the same kernels run).

    PYTHONPATH=build/python python3 python/tests/compile_op.py [--forward 25 --backward 40]
"""
import argparse
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    print("skipped: no CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import fa_course.torch as fat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forward", default="25")
    parser.add_argument("--backward", default="40")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, n, h, 64, device="cuda", dtype=torch.float16, generator=gen)
               for n, h in ((200, 8), (333, 2), (333, 2)))
    failures = 0
    for causal in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        try:
            torch.library.opcheck(torch.ops.fa_course.forward.default,
                                  (*leaves, args.forward, args.backward, causal, None))
            print(f"opcheck fa_course::forward, causal={causal}: passed")
        except Exception as e:  # opcheck raises on the first test that fails
            print(f"opcheck fa_course::forward, causal={causal}: FAILED: {type(e).__name__}: {e}")
            failures += 1

        def f(q, k, v):
            return fat.attention_op(q, k, v, forward_step=args.forward, backward_step=args.backward, causal=causal)

        g = torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=gen)
        eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        eager = f(*eager_leaves)
        eager_grads = torch.autograd.grad(eager, eager_leaves, g)
        compiled_f = torch.compile(f, fullgraph=True)
        comp_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        comp = compiled_f(*comp_leaves)
        comp_grads = torch.autograd.grad(comp, comp_leaves, g)
        same = torch.equal(eager, comp) and all(torch.equal(a, b) for a, b in zip(eager_grads, comp_grads))
        print(f"torch.compile(fullgraph=True) of attention_op {args.forward} / {args.backward}, causal={causal}: "
              f"output and gradients {'equal the eager call' if same else 'DIFFER from the eager call'}")
        failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
