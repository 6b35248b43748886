"""The Kubernetes manifests (deploy/k8s) and the Indexed Job's shard runner (deploy/fanout.py):
every manifest validates against the Kubernetes schemas (kubernetes-validate, a test
dependency: missing, these tests fail); the Job is one cold invocation, the Indexed Job fans a
requests file out with ``reflex stdio`` per pod; split and merge are each other's inverse and
merge refuses incomplete or foreign results; and the Indexed Job's pod command line, taken from
the manifest, run once per index on the CPU backend, gives the replies one ``reflex stdio``
gives for the whole file, in request order."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
VERSIONS = ("1.29.0", "1.37.0")  # the oldest with backoffLimitPerIndex on by default, the newest


def need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is missing ({e}): install the test extras (pip install "
                    "'.[test]'; scripts/test.sh does)", pytrace=False)



def manifests() -> dict[str, list[dict]]:
    yaml = need("yaml")
    out = {}
    for f in sorted(DEPLOY.rglob("*.yaml")):
        out[f.relative_to(DEPLOY).as_posix()] = [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def one(name: str) -> dict:
    docs = manifests()[name]
    assert len(docs) == 1, name
    return docs[0]


def pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def container(job: dict) -> dict:
    cs = pod(job)["containers"]
    assert len(cs) == 1
    return cs[0]


def mounts(job: dict) -> dict[str, tuple[str, bool, dict]]:
    """{volume name: (mount path, mounted read-only, the volume)}"""
    vols = {v["name"]: v for v in pod(job)["volumes"]}
    return {m["name"]: (m["mountPath"], m.get("readOnly", False), vols[m["name"]])
            for m in container(job)["volumeMounts"]}


@pytest.fixture(scope="module")
def fanout():
    spec = importlib.util.spec_from_file_location("fanout", DEPLOY / "fanout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------
# The manifests


def test_every_manifest_validates_against_the_kubernetes_schemas():
    kv = need("kubernetes_validate")
    found = manifests()
    assert set(found) == {"k8s/job.yaml", "k8s/indexed-job.yaml", "k8s/index-job.yaml",
                          "k8s/volumes.yaml"}
    for name, docs in found.items():
        for doc in docs:
            for version in VERSIONS:
                # strict: an unknown field (a typo) is an error, not ignored
                kv.validate(doc, version, strict=True)


def test_the_validator_refuses_a_wrong_manifest():
    kv = need("kubernetes_validate")
    job = one("k8s/job.yaml")
    for path, value in [(("spec", "backofLimit"), 0),  # a typo
                        (("spec", "completions"), "four"),
                        (("spec", "template", "spec", "containers"), [{"image": "reflex"}])]:
        bad = copy.deepcopy(job)
        at = bad
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, VERSIONS[-1], strict=True)


def test_job_is_one_cold_invocation():
    job = one("k8s/job.yaml")
    assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
    assert pod(job)["restartPolicy"] == "Never"
    c = container(job)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "command" not in c  # the image's entrypoint: reflex generate
    path, ro, vol = mounts(job)["models"]
    assert ro and vol["persistentVolumeClaim"]["readOnly"] is True
    assert c["args"][0].startswith(path + "/") and c["args"][0].endswith(".gguf")
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod(job)["securityContext"]["runAsNonRoot"] is True


def test_indexed_job_fans_out_over_reflex_stdio():
    job = one("k8s/indexed-job.yaml")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and pod(job)["restartPolicy"] == "Never"
    cmd = container(job)["command"]
    assert cmd[:2] == ["reflex-fanout", "serve"]
    assert int(cmd[cmd.index("--shards") + 1]) == spec["completions"]
    assert 1 <= spec["parallelism"] <= spec["completions"]
    assert cmd[cmd.index("--") + 1:cmd.index("--") + 3] == ["reflex", "stdio"]
    m = mounts(job)
    assert m["models"][1] and m["requests"][1] and not m["results"][1]
    assert cmd[2].startswith(m["requests"][0] + "/")
    assert cmd[cmd.index("--out") + 1] == m["results"][0]
    assert cmd[-1].startswith(m["models"][0] + "/")
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_index_job_writes_beside_the_model():
    job = one("k8s/index-job.yaml")
    cmd = container(job)["command"]
    path, ro, _ = mounts(job)["models"]
    assert cmd[:2] == ["reflex", "index"] and cmd[2].startswith(path + "/") and not ro
    assert "nvidia.com/gpu" not in container(job)["resources"].get("limits", {})
    claims = {d["metadata"]["name"] for d in manifests()["k8s/volumes.yaml"]}
    for name in ("k8s/job.yaml", "k8s/indexed-job.yaml", "k8s/index-job.yaml"):
        for _, _, vol in mounts(one(name)).values():
            if "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in claims


# ----------------------------------------------------------------------------------------------
# Split and merge


def test_split_is_a_partition_and_merge_its_inverse(fanout):
    rng = random.Random(19)
    for total in (0, 1, 2, 7, 31):
        items = [f"r{i}" for i in range(total)]
        for n in (1, 2, 3, 5, 8, 40):
            shards = [fanout.shard_of(items, n, i) for i in range(n)]
            assert sorted(x for s in shards for x in s) == sorted(items)  # each exactly once
            for s in shards:  # in file order within a shard
                assert s == sorted(s, key=items.index)
            assert max(map(len, shards)) - min(map(len, shards)) <= 1  # even
            assert fanout.merge_order(shards, total) == items
        rng.shuffle(items)


def write_requests(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def fake_replies(fanout, lines: list[bytes]) -> list[bytes]:
    return [json.dumps({"id": fanout.expected_id(x), "result": {"k": k}}).encode() + b"\n"
            for k, x in enumerate(lines)]


def test_requests_are_the_non_blank_lines(fanout, tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"id": 1, "op": "ping"}\n\n   \n{"op": "ping"}\r\nnot json\n\t\n[1]')
    lines, crc = fanout.read_requests(str(p))
    assert lines == [b'{"id": 1, "op": "ping"}', b'{"op": "ping"}\r', b"not json", b"[1]"]
    assert [fanout.expected_id(x) for x in lines] == [1, None, None, None]


def test_expected_ids_are_the_ones_stdio_echoes(fanout):
    """merge checks each reply's id against expected_id: it must read a line as stdio does."""
    from reflex_core import ipc

    def stdio_id(line: bytes):
        if len(line) > ipc.MAX_LINE:  # the reader answers too_large, id null
            return None
        try:
            return ipc.parse_request(line)[0]
        except ipc.RequestError as e:
            return e.req_id

    lines = [b'{"id": 1, "op": "ping"}', b'{"id": "a", "op": "fly"}', b'{"id": [1, {}]}',
             b'\xef\xbb\xbf{"id": 2, "op": "ping"}', b'{"id": 3, "op": "ping", "x": NaN}',
             b'{"id": 4, "op": "ping", "x": 1e400}', b'{"id": 5, "t": "\xed\xa0\x80"}',
             b'{"id": 6, "d": ' + b"[" * 200000 + b"]" * 200000 + b"}", b"[" * 200000,
             b'{"id": 7, "t": "' + b"a" * ipc.MAX_LINE + b'"}', b'{"id": 8.5, "op": "ping"}\r']
    assert [fanout.expected_id(x) for x in lines] == [stdio_id(x) for x in lines]
    assert [fanout.expected_id(x) for x in lines][:3] == [1, "a", [1, {}]]


def run_fanout(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPLOY / "fanout.py"), *args],
                          capture_output=True, env=env, timeout=120, **kw)


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_merge_refuses_incomplete_or_foreign_results(fanout, tmp_path):
    lines = [json.dumps({"id": i, "op": "ping"}).encode() for i in range(7)] + [b"oops"]
    req = write_requests(tmp_path / "r.jsonl", lines)
    _, crc = fanout.read_requests(str(req))
    res = tmp_path / "results"
    res.mkdir()
    replies = fake_replies(fanout, lines)
    n = 3
    for i in range(n):
        (res / fanout.result_name(i, n, crc)).write_bytes(b"".join(fanout.shard_of(replies, n, i)))
    r = run_fanout("merge", str(req), "--shards", "3", "--results", str(res))
    assert r.returncode == 0 and r.stdout == b"".join(replies)
    out = tmp_path / "merged.jsonl"
    assert run_fanout("merge", str(req), "--shards", "3", "--results", str(res), "-o",
                      str(out)).returncode == 0
    assert out.read_bytes() == b"".join(replies)
    # another N, another requests file: their results are not these
    assert "shard(s) 0, 1, 2, 3 of 4" in one_line(
        run_fanout("merge", str(req), "--shards", "4", "--results", str(res)))
    other = write_requests(tmp_path / "other.jsonl", lines[:-1] + [b"oops!"])
    assert "of 3 for this requests file" in one_line(
        run_fanout("merge", str(other), "--shards", "3", "--results", str(res)))
    # a shard missing, one short, one out of order
    f1 = res / fanout.result_name(1, n, crc)
    keep = f1.read_bytes()
    f1.unlink()
    assert "shard(s) 1 of 3" in one_line(
        run_fanout("merge", str(req), "--shards", "3", "--results", str(res)))
    f1.write_bytes(keep.split(b"\n", 1)[1])
    assert "2 replies for 3 requests" in one_line(
        run_fanout("merge", str(req), "--shards", "3", "--results", str(res)))
    a, b, c = keep.splitlines(keepends=True)
    f1.write_bytes(b + a + c)
    assert "the reply to request 1 has id 4, the request 1" in one_line(
        run_fanout("merge", str(req), "--shards", "3", "--results", str(res)))


ECHO_SERVER = """
import json, sys
for k, line in enumerate(sys.stdin):
    if sys.argv[1:] == ["die"] and k == 1:
        sys.exit(3)
    try:
        rid = json.loads(line).get("id")
    except Exception:
        rid = None
    print(json.dumps({"id": rid, "result": {"line": line.rstrip("\\n")}}), flush=True)
"""


def test_serve_sends_the_shard_in_order_and_writes_it_whole(fanout, tmp_path):
    lines = [json.dumps({"id": i, "op": "ping"}).encode() for i in range(5)]
    req = write_requests(tmp_path / "r.jsonl", lines)
    _, crc = fanout.read_requests(str(req))
    res = tmp_path / "results"
    res.mkdir()
    server = [sys.executable, "-c", ECHO_SERVER]
    env = dict(os.environ, JOB_COMPLETION_INDEX="1")
    r = run_fanout("serve", str(req), "--shards", "2", "--out", str(res), "--", *server, env=env)
    assert r.returncode == 0, r.stderr
    got = (res / fanout.result_name(1, 2, crc)).read_bytes().splitlines()
    assert [json.loads(x)["result"]["line"].encode() for x in got] == [lines[1], lines[3]]
    # the server dying midway: no results file, one line
    r = run_fanout("serve", str(req), "--shards", "2", "--index", "0", "--out", str(res), "--",
                   *server, "die")
    assert "ended (exit status 3) after 1 of 3 replies" in one_line(r)
    assert sorted(p.name for p in res.iterdir()) == [fanout.result_name(1, 2, crc)]
    # a shard with no request: an empty file, and no server started for it
    r = run_fanout("serve", str(req), "--shards", "9", "--index", "7", "--out", str(res), "--",
                   "/nonexistent/reflex", "stdio")
    assert r.returncode == 0 and (res / fanout.result_name(7, 9, crc)).read_bytes() == b""
    assert "not in 0..1" in one_line(run_fanout("serve", str(req), "--shards", "2", "--index",
                                                "2", "--out", str(res), "--", *server))
    env = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    assert "JOB_COMPLETION_INDEX" in one_line(run_fanout("serve", str(req), "--shards", "2",
                                                         "--out", str(res), "--", *server,
                                                         env=env))


# ----------------------------------------------------------------------------------------------
# The pod's command line, end to end on the CPU backend

VOLATILE = {"compute_ms", "process_start_to_first_token_ms", "process_start_to_result_ms",
            "seed", "pid"}


def stable(reply: dict) -> dict:
    """A reply less what differs between two runs (timings, a drawn seed, the process id)."""
    if isinstance(reply, dict):
        return {k: stable(v) for k, v in reply.items() if k not in VOLATILE}
    if isinstance(reply, list):
        return [stable(v) for v in reply]
    return reply


REQUESTS = [
    {"id": 1, "op": "ping"},
    {"id": "t", "op": "tokenize", "text": "Hello world"},
    {"id": [3], "op": "generate", "prompt": "The capital of France is", "max_tokens": 3},
    "not json",
    {"op": "ping"},
    {"id": 6, "op": "system1", "prompt": "Is the sky blue?", "candidates": [" yes", " no"]},
    {"id": 7, "op": "detokenize", "token_ids": [9707]},
    {"id": 8, "op": "fly"},
    {"id": 9, "op": "generate", "prompt": "Once upon a time", "max_tokens": 2},
]


def test_indexed_job_pod_command_end_to_end_on_cpu(fanout, tmp_path, qwen_tok_file):
    job = one("k8s/indexed-job.yaml")
    m = mounts(job)
    where = {m[v][0]: tmp_path / v for v in ("models", "requests", "results")}
    for d in where.values():
        d.mkdir()
    cmd = container(job)["command"]
    model_arg, requests_arg = cmd[-1], cmd[2]

    def local(arg: str) -> str:
        for mount, d in where.items():
            if arg.startswith(mount + "/") or arg == mount:
                return str(d) + arg[len(mount):]
        return arg

    model = Path(local(model_arg))
    shutil.copyfile(qwen_tok_file, model)
    lines = [x.encode() if isinstance(x, str) else json.dumps(x).encode() for x in REQUESTS]
    lines.insert(3, b"")  # a blank line: no request
    req = write_requests(Path(local(requests_arg)), lines)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), REFLEX_NO_INDEX="",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    env.pop("REFLEX_INDEX_DIR", None)
    assert subprocess.run(["reflex", "index", str(model)], env=env,
                          capture_output=True).returncode == 0  # as index-job.yaml does
    # each pod: the manifest's command, its paths where the volumes are mounted here
    argv = [local(a) for a in cmd]
    assert argv[0] == "reflex-fanout"
    argv = [sys.executable, str(DEPLOY / "fanout.py"), *argv[1:]]
    n = job["spec"]["completions"]
    for i in range(n):
        r = subprocess.run(argv, env=dict(env, JOB_COMPLETION_INDEX=str(i)), capture_output=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr.decode()[-3000:]
    results = where[m["results"][0]]
    assert len(list(results.glob("shard-*.jsonl"))) == n
    merged = run_fanout("merge", str(req), "--shards", str(n), "--results", str(results))
    assert merged.returncode == 0, merged.stderr
    replies = [json.loads(x) for x in merged.stdout.splitlines()]
    # the same file through one `reflex stdio`, in order
    one_server = subprocess.run(["reflex", "stdio", str(model)], input=req.read_bytes(), env=env,
                                capture_output=True, timeout=300)
    assert one_server.returncode == 0, one_server.stderr.decode()[-3000:]
    expected = [json.loads(x) for x in one_server.stdout.splitlines()]
    assert len(replies) == len(REQUESTS) and [stable(x) for x in replies] == \
        [stable(x) for x in expected]
    assert [r["id"] for r in replies] == [1, "t", [3], None, None, 6, 7, 8, 9]
    assert replies[2]["result"]["n_tokens"] == 3 and replies[3]["error"]["code"] == "parse_error"
