"""A minimal client of ``reflex stdio`` and ``reflex uds`` (the protocol: docs/ipc.md).

    python examples/ipc_client.py stdio MODEL.gguf [--backend cpu]   # starts the server itself
    python examples/ipc_client.py uds /tmp/reflex.sock                # `reflex uds MODEL PATH` runs
"""
import itertools, json, socket, subprocess, sys


class Client:
    def __init__(self, mode: str, target: str, *server_args: str):
        if mode == "stdio":  # `reflex stdio ...` as a child: its stdin/stdout are the channel
            cmd = [sys.executable, "-m", "reflex_core", "stdio", target, *server_args]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.w, self.r = self.proc.stdin, self.proc.stdout
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(target)
            self.w, self.r = sock.makefile("wb"), sock.makefile("rb")
        self.ids = itertools.count()

    def call(self, op: str, **params):
        rid = next(self.ids)
        self.w.write(json.dumps({"id": rid, "op": op, **params}).encode() + b"\n")
        self.w.flush()
        reply = json.loads(self.r.readline())  # replies come in request order
        assert reply["id"] == rid, reply
        if "error" in reply:
            raise RuntimeError(f"{reply['error']['code']}: {reply['error']['message']}")
        return reply["result"]


if __name__ == "__main__":
    c = Client(*sys.argv[1:])
    print(c.call("generate", prompt="The capital of France is", max_tokens=8)["text"])
    print(c.call("system1", prompt="2 + 2 =", candidates=[" 4", " 5"])["best_text"])
