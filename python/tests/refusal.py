"""One helper the module's refusal tests share (python/tests/refusals_no_gpu.py, tests/python/test_module_refusals.py)."""


def refusal(call, *args, **kwargs) -> str:
    """The ValueError's message of call(*args, **kwargs), which must refuse."""
    try:
        call(*args, **kwargs)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"{call.__name__}{args[:1]} did not refuse")
