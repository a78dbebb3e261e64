"""Simulations in a worker process (`rollout.plan.simulate_variants`): reads length-prefixed pickles of
(job, variant, keyword arguments) from stdin until it closes, and answers each with the pickled SimResult; a
simulation that raises ends the worker (the caller then runs that variant itself and sees the error)."""

from __future__ import annotations

import pickle
import struct
import sys

from qsync_opt.rollout.simulate import simulate

_LEN = struct.Struct("<Q")


def write_msg(f, data: bytes) -> None:
    f.write(_LEN.pack(len(data)))
    f.write(data)
    f.flush()


def read_msg(f) -> bytes | None:
    """One message, or None at the end of the stream."""
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    data = f.read(n)
    return data if len(data) == n else None


def main() -> None:
    while (msg := read_msg(sys.stdin.buffer)) is not None:
        job, variant, kw = pickle.loads(msg)
        write_msg(sys.stdout.buffer, pickle.dumps(simulate(job, variant, **kw)))


if __name__ == "__main__":
    main()
