"""The unit-test runner that runs inside the sandbox (``python runner.py CONTROL CHANNEL``).

It runs ``solution.py`` as ``__main__``, then reads the tests from the CONTROL descriptor (a
nonce and one source per top-level test statement, sent only now: the program never saw them
while it ran on its own) and runs them one statement at a time in the program's namespace.
Every ``assert`` of the tests was rewritten by the trainer (:mod:`maxent_grpo.rewards.unit_tests`)
into a call of ``__maxent_check__`` with the assert's number and its operands but the literal
ones (the expected values stay with the trainer); it writes them, reduced to plain data (exact
built-in types only), to the CHANNEL pipe; a ``done`` record follows each statement that ran to
its end; ``__maxent_plain__`` guards the values nested in the operands (the same exact types,
else the statement stops). The trainer compares the operands itself and scores a statement
only with its ``done`` record: an early exit, an exception hook or an object equal to
everything fails. Only the standard library is used: this file runs under the sandbox's bare
interpreter.
"""

import json
import os
import sys

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def plain(value, depth=0):
    """The value rebuilt from exact built-in types; anything else (a subclass too) raises."""
    kind = type(value)
    if depth > 50:
        raise ValueError("nested too deep")
    if kind in _SCALARS:
        return value
    if kind in (list, tuple, set, frozenset):
        return kind([plain(item, depth + 1) for item in value])
    if kind is dict:
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"{kind.__name__} is not plain data")


def main(control_fd, channel_fd, write=os.write, dumps=json.dumps, plain_=plain, repr_=repr):
    # Names bound now: the program, run below in this process, could rebind module globals.
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    with open("solution.py", encoding="utf-8") as handle:
        program = compile(handle.read(), "solution.py", "exec")
    sys.argv = ["solution.py"]
    exec(program, namespace)
    chunks = []
    while chunk := os.read(control_fd, 1 << 16):
        chunks.append(chunk)
    control = json.loads(b"".join(chunks))
    nonce, statement = control["nonce"], [0]

    def record(**fields):
        write(channel_fd, dumps({"nonce": nonce, "statement": statement[0], **fields}).encode())
        write(channel_fd, b"\n")

    def check(site, *operands):
        try:
            values = [repr_(plain_(operand)) for operand in operands]
        except (TypeError, ValueError, RecursionError) as err:
            values = None
            print(f"test {statement[0]}: operand not plain data ({err})", file=sys.stderr)
        record(site=site, values=values)

    def checked(value):
        plain_(value)  # raises for anything but plain data: the statement stops, no done record
        return value

    namespace["__maxent_check__"] = check
    namespace["__maxent_plain__"] = checked
    for index, source in enumerate(control["tests"]):
        statement[0] = index
        exec(compile(source, f"test_{index}", "exec"), namespace)
        record(done=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
