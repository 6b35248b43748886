#!/usr/bin/env python3
"""Fan a JSONL file of ``reflex stdio`` requests out over the N pods of a Kubernetes Indexed Job,
then merge their replies back in request order. Standard library only: it runs in the image's
plain Python (``reflex-fanout``) and on any machine that can read the results volume.

  reflex-fanout split REQUESTS --shards N [--index I]            the shard's request lines
  reflex-fanout serve REQUESTS --shards N [--index I] --out DIR -- reflex stdio MODEL [...]
  reflex-fanout merge REQUESTS --shards N --results DIR [-o OUT]  all replies, in request order

Requests are the file's non-blank lines (``reflex stdio`` answers every other line with exactly
one reply, in order, and ignores blank ones); request k (from 0) goes to shard k mod N, so a
file sorted by size still spreads evenly. ``--index`` defaults to ``$JOB_COMPLETION_INDEX``
(set by Kubernetes in each pod of an Indexed Job); N must be the Job's ``completions``.

``serve`` starts the command once (one warm model per pod), sends the shard's requests one at a
time -- each written after the previous reply arrived, strictly in order -- and writes the
replies to ``DIR/shard-IIIII-of-NNNNN-CCCCCCCC.jsonl`` (CCCCCCCC: the CRC-32 of the requests
file, so results of another request file are never merged) through a temporary file and a
rename: a shard's file exists only once all of its replies are in it. SIGTERM (a pod being
stopped) is passed to the command, which finishes the request under way; the shard then fails.

``merge`` checks every shard's file is there with as many replies as the shard has requests,
and that each reply's ``id`` is its request's (null for a line that is not a JSON object), then
writes the replies in request order. Exit status: 0, 1 with one line on stderr, 2 for usage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import zlib


class FanoutError(Exception):
    """A one-line error for stderr (exit status 1)."""


def read_requests(path: str) -> tuple[list[bytes], int]:
    """(the request lines of ``path`` without their newline, the CRC-32 of the whole file)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FanoutError(f"{path}: cannot read the requests: {e.strerror or e}") from None
    lines = [line for line in data.split(b"\n") if line.strip()]
    return lines, zlib.crc32(data)


def shard_of(lines: list, n: int, i: int) -> list:
    """The items of shard ``i`` of ``n``: every n-th from the i-th."""
    return lines[i::n]


def merge_order(shards: list[list], total: int) -> list:
    """The inverse of the split: ``shards[k % n][k // n]`` for k in 0..total-1."""
    n = len(shards)
    return [shards[k % n][k // n] for k in range(total)]


def result_name(i: int, n: int, crc: int) -> str:
    return f"shard-{i:05d}-of-{n:05d}-{crc:08x}.jsonl"


MAX_LINE = 16 << 20  # reflex stdio's bound on a request line (docs/ipc.md)


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    v = float(text)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return v


def expected_id(request: bytes):
    """The id ``reflex stdio`` echoes for this request line: its ``id`` if it is a JSON object
    (null when absent), else null -- read by stdio's rules (docs/ipc.md): over 16 MiB, not
    strict UTF-8 (a BOM is no whitespace there), NaN/Infinity or a number beyond the floats, or
    nested too deep is no object."""
    if len(request) > MAX_LINE:
        return None
    try:
        obj = json.loads(request.decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        return None
    return obj.get("id") if isinstance(obj, dict) else None


def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise FanoutError(f"{path}: cannot write the replies: {e.strerror or e}") from None


def shard_index(given: int | None, n: int) -> int:
    if given is None:
        env = os.environ.get("JOB_COMPLETION_INDEX")
        if env is None:
            raise FanoutError("no --index and no JOB_COMPLETION_INDEX (set by Kubernetes in an "
                              "Indexed Job's pods)")
        try:
            given = int(env)
        except ValueError:
            raise FanoutError(f"JOB_COMPLETION_INDEX={env!r} is not an integer") from None
    if not 0 <= given < n:
        raise FanoutError(f"shard index {given} is not in 0..{n - 1} (--shards {n}: the Job's "
                          f"completions)")
    return given


def serve(requests: list[bytes], command: list[str]) -> list[bytes]:
    """Send ``requests`` to ``command`` (a ``reflex stdio`` server) one at a time and return its
    reply lines (newline included)."""
    if not command:
        raise FanoutError("no command to serve the shard (give it after --, e.g. -- reflex "
                          "stdio MODEL)")
    if not requests:  # more shards than requests: nothing to load the model for
        return []
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as e:
        raise FanoutError(f"cannot start {command[0]}: {e.strerror or e}") from None
    stopped = []

    def on_term(signum, frame):
        stopped.append(signum)
        proc.send_signal(signum)  # it answers the request under way, then exits

    old = signal.signal(signal.SIGTERM, on_term)
    replies: list[bytes] = []
    try:
        for line in requests:
            if stopped:
                break
            try:
                proc.stdin.write(line + b"\n")
                proc.stdin.flush()
            except BrokenPipeError:
                break
            reply = proc.stdout.readline()
            if not reply.endswith(b"\n"):
                break
            replies.append(reply)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    finally:
        code = proc.wait()
        signal.signal(signal.SIGTERM, old)
    if stopped:
        raise FanoutError(f"stopped by SIGTERM after {len(replies)} of {len(requests)} replies")
    if len(replies) != len(requests):
        raise FanoutError(f"{command[0]} ended (exit status {code}) after {len(replies)} of "
                          f"{len(requests)} replies")
    if code != 0:
        raise FanoutError(f"{command[0]} exited with status {code}")
    return replies


def merge(requests: list[bytes], crc: int, n: int, folder: str) -> list[bytes]:
    shards, missing = [], []
    for i in range(n):
        path = os.path.join(folder, result_name(i, n, crc))
        try:
            with open(path, "rb") as f:
                replies = f.read().splitlines(keepends=True)
        except FileNotFoundError:
            missing.append(i)
            continue
        except OSError as e:
            raise FanoutError(f"{path}: {e.strerror or e}") from None
        want = len(shard_of(requests, n, i))
        if len(replies) != want:
            raise FanoutError(f"{path}: {len(replies)} replies for {want} requests")
        shards.append(replies)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise FanoutError(f"no results of shard(s) {shown} of {n} for this requests file in "
                          f"{folder} (failed or not finished: see the Job's failed indexes)")
    merged = merge_order(shards, len(requests))
    for k, (request, reply) in enumerate(zip(requests, merged)):
        try:
            got = json.loads(reply).get("id")
        except (ValueError, AttributeError):
            raise FanoutError(f"the reply to request {k} is not a JSON object") from None
        if got != expected_id(request):
            raise FanoutError(f"the reply to request {k} has id {got!r}, the request "
                              f"{expected_id(request)!r}: results of another run?")
    return merged


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(prog="reflex-fanout", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("split", "serve", "merge"):
        p = sub.add_parser(name)
        p.add_argument("requests", help="the JSONL file of requests")
        p.add_argument("--shards", type=int, required=True, help="N: the Job's completions")
        if name != "merge":
            p.add_argument("--index", type=int, default=None,
                           help="this shard (default: $JOB_COMPLETION_INDEX)")
        if name == "serve":
            p.add_argument("--out", required=True, help="the results folder")
        if name == "merge":
            p.add_argument("--results", required=True, help="the results folder")
            p.add_argument("-o", "--output", default="-", help="where to write (default: stdout)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    if command and args.what != "serve":
        ap.error("a command after -- is for serve only")
    try:
        requests, crc = read_requests(args.requests)
        if args.what == "merge":
            data = b"".join(merge(requests, crc, args.shards, args.results))
            if args.output == "-":
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            else:
                write_atomic(args.output, data)
            return 0
        i = shard_index(args.index, args.shards)
        mine = shard_of(requests, args.shards, i)
        if args.what == "split":
            sys.stdout.buffer.write(b"".join(line + b"\n" for line in mine))
            sys.stdout.buffer.flush()
            return 0
        replies = serve(mine, command)
        path = os.path.join(args.out, result_name(i, args.shards, crc))
        write_atomic(path, b"".join(replies))
        print(f"reflex-fanout: shard {i} of {args.shards}: {len(replies)} replies -> {path}",
              file=sys.stderr)
        return 0
    except FanoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
