"""The unit-test runner that runs inside the sandbox (``python runner.py CONTROL CHANNEL``).

It runs ``solution.py`` as ``__main__``, then reads the tests from the CONTROL descriptor (a
nonce and one source per top-level test statement, sent only now: the program never saw them
while it ran on its own) and runs them one statement at a time in the program's namespace.
Every check of the tests was rewritten by the trainer (:mod:`maxent_grpo.rewards.unit_tests`)
into a call of ``__maxent_check__`` with the check's number and its holes, the parts that need
the program (the expected side and the comparison stay with the trainer); it writes their
values, as JSON of exact built-in types only, to the CHANNEL pipe; a ``done`` record follows
each statement that ran to its end. The trainer evaluates each check itself and scores a
statement only with its ``done`` record: an early exit, an exception hook or an object equal to
everything fails. Only the standard library is used: this file runs under the sandbox's bare
interpreter.
"""

import json
import os
import sys

_TAGS = {tuple: "t", set: "s", frozenset: "f"}


def plain(value, depth=0):
    """The value as JSON data, exact built-in types only (a subclass, or anything else,
    raises); tuples, sets, dicts, bytes and complex numbers tagged (see outside.decode)."""
    kind = type(value)
    if depth > 32:
        raise ValueError("nested too deep")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [plain(item, depth + 1) for item in value]
    if kind in _TAGS:
        return {_TAGS[kind]: [plain(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError(f"{kind.__name__} is not plain data")


def main(control_fd, channel_fd, write=os.write, dumps=json.dumps, plain_=plain):
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

    def check(site, *holes):
        try:
            values = [plain_(hole) for hole in holes]
            record(site=site, values=values)
        except (TypeError, ValueError, RecursionError) as err:
            print(f"test {statement[0]}: a value is not plain data ({err})", file=sys.stderr)
            record(site=site, values=None)

    namespace["__maxent_check__"] = check
    for index, source in enumerate(control["tests"]):
        statement[0] = index
        exec(compile(source, f"test_{index}", "exec"), namespace)
        record(done=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
