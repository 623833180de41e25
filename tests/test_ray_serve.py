"""`hybridrt serve --ray` on a real Ray cluster of two hosts (network namespaces joined by a
veth pair, joined with --ray-address): an engine replica on each host behind the front,
answering as `hybridrt serve` does, a conversation's turns kept on the replica that holds its
states, a turn sent past its busy replica resuming from states moved from the other host, and a
replica killed in the middle of a stream; and a local cluster started by `--ray` itself, whose
replica cannot load its model."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serving import running, sse_data, wait_for

import hybridrt
from hybridrt.deploy.ray_peers import StateDirectory, TransferCost
from hybridrt.deploy.ray_router import BLOCK_CHARS, affinity_keys
from hybridrt.graphs.manifest import read_manifest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SLOTS = 4  # of each replica of the module's cluster, which is also the affinity router's bound
CLI = "import sys\nfrom hybridrt.cli import main\nsys.exit(main(sys.argv[1:]))\n"


@contextlib.contextmanager
def ray_serve(model: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`hybridrt serve MODEL --ray FLAGS` in its own process (on its own local cluster of 2 CPUs
    unless FLAGS name a running one)."""
    port = _free_port()
    # Ray's socket paths live under its temp directory and must fit AF_UNIX's 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = os.environ | {"RAY_TMPDIR": str(temp), "RAY_USAGE_STATS_ENABLED": "0", "HYBRIDRT_THREADS": "1"}
    # Ray rewrites a 127.0.0.1 cluster address to the host's own address unless told this is a
    # one-machine setup: the tests' clusters listen on the loopback interface only.
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # The two-host cluster (two_hosts) runs without Ray's token authentication, as a local one does.
    env["RAY_AUTH_MODE"] = "disabled"
    local = [] if "--ray-address" in flags else ["--ray-cpus", "2"]
    argv = [sys.executable, "-c", CLI, "serve", str(model), "--ray", *local, "--port", str(port), *flags]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_model_that_does_not_load_fails_the_start_in_one_line(default_onnx: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(default_onnx, broken)
    graph = broken / read_manifest(broken).graph_file
    graph.write_bytes(b"not a graph".ljust(graph.stat().st_size, b"\0"))  # its size kept: the replica finds it
    with ray_serve(broken, "--replicas", "1") as (proc, _):
        _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("hybridrt: error: the Ray Serve application did not start: a replica could not load")
    assert "model.onnx" in last and "Traceback" not in err


def test_a_missing_or_cut_file_is_refused_before_a_cluster_starts(default_onnx: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(default_onnx, cut)
    graph = cut / read_manifest(cut).graph_file
    graph.write_bytes(graph.read_bytes()[:1000])
    with ray_serve(cut, "--replicas", "1") as (proc, _):
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"hybridrt: error: {graph} does not match")
    assert "Ray" not in err  # said by the command itself: no cluster was started


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _complete(url: str, prompt: str, **body: object) -> httpx.Response:
    payload = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0} | body
    return httpx.post(f"{url}/v1/completions", json=payload, timeout=60)


def test_prefix_keys_chain_turn_by_turn() -> None:
    turn1 = "x" * (2 * BLOCK_CHARS + 10)
    turn2 = turn1 + " reply and a new question " * 20
    k1, k2 = affinity_keys("/v1/completions", json.dumps({"prompt": turn1}).encode()), []
    k2 = affinity_keys("/v1/completions", json.dumps({"prompt": turn2}).encode())
    assert len(k1) == 2 and k2[:2] == k1 and len(k2) > 2
    other_model = affinity_keys("/v1/completions", json.dumps({"prompt": turn1, "model": "b"}).encode())
    assert other_model[0] != k1[0]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    c1 = affinity_keys("/v1/chat/completions", json.dumps({"messages": messages[:1]}).encode())
    c2 = affinity_keys("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert len(c1) == 1 and c2[:1] == c1
    assert affinity_keys("/v1/completions", b"not json") == [] == affinity_keys("/v1/models", b"")


def test_a_state_moves_only_where_it_beats_prefilling_again() -> None:
    """The move's expected time (latency + bytes at the measured rate) against the prefill it
    saves; moves refine the rate; the directory names the holder of the longest prefix."""
    cost = TransferCost(latency_s=0.010, seconds_per_byte=1e-9)
    state = 25 << 20  # granite-h-350m's float32 states, ~26 MB: 36 ms expected
    assert not cost.worth(5, state, 0.0054) and cost.worth(10, state, 0.0054)
    assert not cost.worth(0, 0, 1.0)
    cost.observe(state, 0.010 + state * 4e-9)  # a slower move than expected
    assert 1e-9 < cost.seconds_per_byte < 4e-9 and not cost.worth(10, state, 0.0054)
    directory = StateDirectory()
    directory.record(["a", "b"], "r1")
    directory.record(["a", "b", "c"], "r2")
    assert directory.holder(["a", "b", "c", "d"]) == "r2" and directory.holder(["a"]) == "r2"
    assert directory.holder(["x"]) is None


def _clear_stale_hosts() -> None:
    """The namespaces, veth pairs and processes that a killed run of two_hosts left (named after
    a pid that is gone): a stale pair on the same subnet keeps the next cluster from forming."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for tag in (line.split()[0] for line in listed.splitlines() if line.startswith("hrt")):
        pid = int(tag[3:]) if tag[3:].isdigit() else None
        if pid is None or pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        inside = subprocess.run(["ip", "netns", "pids", tag], capture_output=True, text=True, timeout=30).stdout
        for left in inside.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(left), signal.SIGKILL)
        subprocess.run(["ip", "link", "del", f"{tag}a"], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", tag], capture_output=True, timeout=30)


@contextlib.contextmanager
def two_hosts() -> Iterator[str]:
    """A Ray cluster of two hosts on this machine: the head (1 CPU) in this network namespace and
    a worker node (1 CPU) in a namespace of its own, joined by a veth pair (10.77.N.1 and .2);
    the head's address. Needs root and `ip netns` (the tests' machines have both)."""
    _clear_stale_hosts()
    tag = f"hrt{os.getpid()}"
    net = f"10.77.{os.getpid() % 250}"
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    inside = ["ip", "netns", "exec", tag]
    setup = [
        ["ip", "netns", "add", tag],
        ["ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b"],
        ["ip", "link", "set", f"{tag}b", "netns", tag],
        ["ip", "addr", "add", f"{net}.1/24", "dev", f"{tag}a"],
        ["ip", "link", "set", f"{tag}a", "up"],
        [*inside, "ip", "addr", "add", f"{net}.2/24", "dev", f"{tag}b"],
        [*inside, "ip", "link", "set", f"{tag}b", "up"],
        [*inside, "ip", "link", "set", "lo", "up"],
    ]
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    head = f"{net}.1:{_free_port()}"
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        start = ["start", "--num-cpus", "1", "--disable-usage-stats"]
        port = head.rsplit(":", 1)[1]
        head_cmd = [*ray, *start, "--head", "--node-ip-address", f"{net}.1", "--port", port, "--temp-dir", str(temp)]
        subprocess.run(
            [*head_cmd, "--include-dashboard", "false"], check=True, capture_output=True, env=env, timeout=120
        )
        node = [*inside, *ray, *start, "--address", head, "--node-ip-address", f"{net}.2"]
        subprocess.run(node, check=True, capture_output=True, env=env, timeout=120)
        yield head
    finally:
        _stop_cluster(tag, temp)
        subprocess.run(["ip", "link", "del", f"{tag}a"], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", tag], capture_output=True, timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_cluster(tag: str, temp: Path) -> None:
    """Stop two_hosts' processes only: `ray stop` stops every Ray process on the machine, the
    local cluster of a test running beside it on another worker included. The worker node's are
    those in its namespace, the head's those whose command line names its temp dir."""
    listed = subprocess.run(["ip", "netns", "pids", tag], capture_output=True, text=True, timeout=30).stdout
    pids = {int(p) for p in listed.split()}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(temp) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.add(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.1)


@pytest.fixture(scope="module")
def request_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's --log-file: each replica writes requests.<replica id>.log beside it."""
    return tmp_path_factory.mktemp("request-logs") / "requests.log"


@pytest.fixture(scope="module")
def cluster(default_onnx: Path, request_logs: Path) -> Iterator[str]:
    """Two engine replicas of the default model on a cluster of two hosts of 1 CPU each
    (two_hosts), one replica on each, both answering; the front's URL."""
    with two_hosts() as address:
        flags = ("--ray-address", address, "--replicas", "2", "--slots", str(SLOTS), "--cache-mb", "64")
        flags += ("--log-file", str(request_logs))
        with ray_serve(default_onnx, *flags, "--model-name", "tiny") as (proc, url):
            assert wait_for(lambda: _healthy(url) or proc.poll() is not None, 120), "the Ray app did not come up"
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            yield url


def test_replicas_answer_from_both_hosts(cluster: str) -> None:
    nodes: dict[str, str] = {}  # replica -> node

    def both_nodes() -> bool:  # the second replica may still be starting when /health first answers
        r = _complete(cluster, f"{len(nodes)} {time.monotonic()} on a node " * 10)
        if r.status_code == 200:
            nodes[r.headers["x-hybridrt-replica"]] = r.headers["x-hybridrt-replica-node"]
        return len(set(nodes.values())) == 2

    assert wait_for(both_nodes, 60), f"replicas answered from {len(set(nodes.values()))} node(s)"


def test_each_replica_logs_its_requests_in_a_file_of_its_own(cluster: str, request_logs: Path) -> None:
    answered: dict[str, set[str]] = {}  # replica -> request ids

    def both_replicas() -> bool:
        r = _complete(cluster, f"{time.monotonic()} a line for the log " * 8)
        if r.status_code == 200:
            [rid] = r.headers.get_list("x-request-id")  # one id, the one its replica logged
            answered.setdefault(r.headers["x-hybridrt-replica"], set()).add(rid)
        return len(answered) == 2

    assert wait_for(both_replicas, 60)
    payload = {"model": "tiny", "prompt": "named by its client", "max_tokens": 4}
    named = httpx.post(f"{cluster}/v1/completions", json=payload, headers={"X-Request-ID": "client-7"}, timeout=60)
    assert named.status_code == 200 and named.headers.get_list("x-request-id") == ["client-7"]
    answered[named.headers["x-hybridrt-replica"]].add("client-7")

    def logged() -> bool:
        for replica, ids in answered.items():
            path = request_logs.parent / f"requests.{replica}.log"
            lines = path.read_text().splitlines() if path.exists() else []
            if not ids <= {json.loads(line)["request_id"] for line in lines}:
                return False
        return True

    assert wait_for(logged, 30), (answered, sorted(p.name for p in request_logs.parent.iterdir()))


def test_replicas_answer_as_the_server_does(cluster: str, default_onnx: Path) -> None:
    prompt = "The quick brown fox"
    with running(hybridrt.load(default_onnx), model_name="tiny", api_key=None) as local:
        want = _complete(local.url, prompt).json()["choices"][0]["text"]
        bad_local = _complete(local.url, prompt, temperature=-1)
    got = _complete(cluster, prompt)
    assert got.status_code == 200 and got.json()["choices"][0]["text"] == want
    bad = _complete(cluster, prompt, temperature=-1)
    assert bad.status_code == bad_local.status_code == 400
    assert bad.json()["error"]["message"] == bad_local.json()["error"]["message"]
    assert httpx.get(f"{cluster}/v1/models", timeout=30).json()["data"][0]["id"] == "tiny"
    seen = {_complete(cluster, f"{i} " * 30).headers["x-hybridrt-replica"] for i in range(12)}
    assert len(seen) == 2  # both replicas take new prompts


def test_a_conversations_turns_stay_on_the_replica_with_its_states(cluster: str) -> None:
    conversations = [f"Conversation {c}: " + "a story about the sea and the ships " * 12 for c in range(4)]
    homes: dict[int, set[str]] = {c: set() for c in range(4)}
    for turn in range(3):
        for c, history in enumerate(conversations):
            r = _complete(cluster, history, max_tokens=6)
            assert r.status_code == 200
            homes[c].add(r.headers["x-hybridrt-replica"])
            if turn:
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            conversations[c] = history + r.json()["choices"][0]["text"] + f" and then turn {turn} came "
    assert all(len(h) == 1 for h in homes.values()), homes


def _turn_past_its_busy_replica(url: str) -> tuple[str, str, httpx.Response]:
    """Turn 1 of a conversation on its replica, which `SLOTS` open streams continuing it then
    hold at the affinity bound, and turn 2 (sent elsewhere): the first replica, its node and
    turn 2's response."""
    history = "A log of the harbour: " + "ships came in with the tide and left at dawn. " * 14
    first = _complete(url, history, max_tokens=6)
    assert first.status_code == 200
    home = first.headers["x-hybridrt-replica"]
    turn2 = history + first.json()["choices"][0]["text"] + " The harbour master wrote again: " * 3
    busy = {"model": "tiny", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with contextlib.ExitStack() as streams:
        for i in range(SLOTS):  # the affinity bound: the holder now has --slots requests in hand
            r = streams.enter_context(
                httpx.stream("POST", f"{url}/v1/completions", json=busy | {"prompt": f"{history} {i}"}, timeout=60)
            )
            assert r.status_code == 200 and r.headers["x-hybridrt-replica"] == home
        moved = _complete(url, turn2, max_tokens=8)
    assert moved.status_code == 200 and moved.headers["x-hybridrt-replica"] != home
    return home, first.headers["x-hybridrt-replica-node"], moved


def test_a_turn_sent_past_its_busy_replica_resumes_from_states_moved_there(cluster: str, default_onnx: Path) -> None:
    """A conversation's next turn that the router sends elsewhere (its replica has `--slots`
    requests in hand) resumes from the holder's state, moved through Ray's object store from
    the other host (across the veth pair), and answers as a cold server does."""
    home, home_node, moved = _turn_past_its_busy_replica(cluster)
    assert moved.headers["x-hybridrt-replica-node"] != home_node
    source, *fields = moved.headers["x-hybridrt-state-from"].split("; ")
    figures = dict(f.split("=") for f in fields)
    assert source == home and int(figures["tokens"]) > 100 and int(figures["bytes"]) > 0
    assert moved.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == int(figures["tokens"])
    prompt = json.loads(moved.request.content)["prompt"]
    with running(hybridrt.load(default_onnx), model_name="tiny", api_key=None) as local:
        cold = _complete(local.url, prompt, max_tokens=8).json()
    assert moved.json()["choices"][0]["text"] == cold["choices"][0]["text"]
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_killed_replica_ends_its_streams_with_an_error_and_the_others_answer(
    cluster: str, default_onnx: Path
) -> None:
    longest = hybridrt.load(default_onnx).manifest.max_length - 8
    payload = {"model": "tiny", "prompt": "Once", "max_tokens": longest, "stream": True, "ignore_eos": True}
    events: list[str] = []
    with httpx.stream("POST", f"{cluster}/v1/completions", json=payload, timeout=60) as r:
        assert r.status_code == 200
        pid, victim = int(r.headers["x-hybridrt-replica-pid"]), r.headers["x-hybridrt-replica"]
        for data in sse_data(r):
            events.append(data)
            if len(events) == 3:
                os.kill(pid, signal.SIGKILL)
    assert len(events) < longest and "error" in json.loads(events[-1])
    t0 = time.monotonic()
    after = _complete(cluster, "After the crash")
    assert after.status_code == 200 and after.headers["x-hybridrt-replica"] != victim
    assert time.monotonic() - t0 < 30

    def two_again() -> bool:
        return len({_complete(cluster, f"{i} again " * 30).headers["x-hybridrt-replica"] for i in range(8)}) == 2

    assert wait_for(two_again, 90)  # Ray started a new replica


def test_the_local_cluster_size_is_refused_with_a_running_cluster(default_onnx: Path) -> None:
    argv = [sys.executable, "-c", CLI, "serve", str(default_onnx), "--ray", "--ray-cpus", "2", "--ray-address", "auto"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--ray-cpus sizes the local cluster" in done.stderr


def test_autoscaling_adds_a_replica_under_load_and_drains_it_after(default_onnx: Path) -> None:
    """--replicas 1 --max-replicas 2 on a local cluster of 2 CPUs: concurrent streams past the
    target of ongoing requests bring a second replica (answers come from two processes), and
    once the load falls back to one client one replica is scaled down (its process ends, the
    other answers); every request of the whole cycle, those running while it drained included,
    is answered in full."""
    flags = ("--replicas", "1", "--max-replicas", "2", "--target-ongoing", "1", "--replica-cpus", "1")
    flags += ("--slots", "2", "--model-name", "tiny")
    pids: dict[str, int] = {}  # replica -> its process
    failed: list[str] = []
    heavy, done = threading.Event(), threading.Event()

    def client(i: int) -> None:
        n = 0
        while not done.is_set():
            if i and not heavy.is_set():  # client 0 keeps asking throughout, the others under load only
                time.sleep(0.1)
                continue
            n += 1
            payload = {"model": "tiny", "prompt": f"{i} {n} streams " * 12, "max_tokens": 48, "stream": True}
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=payload, timeout=60) as r:
                    events = list(sse_data(r))
                errors = [e for e in events[:-1] if "error" in json.loads(e)]
                if r.status_code != 200 or errors or events[-1:] != ["[DONE]"]:
                    failed.append(f"{r.status_code}: {events[-2:]}")
                else:
                    pids[r.headers["x-hybridrt-replica"]] = int(r.headers["x-hybridrt-replica-pid"])
            except httpx.HTTPError as e:
                failed.append(repr(e))

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    with ray_serve(default_onnx, *flags) as (proc, url):
        assert wait_for(lambda: _healthy(url) or proc.poll() is not None, 120), "the Ray app did not come up"
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with ThreadPoolExecutor(6) as pool:
            clients = [pool.submit(client, i) for i in range(6)]
            try:
                heavy.set()
                assert wait_for(lambda: len(pids) == 2, 180), f"no second replica under load: {pids}, {failed[:3]}"
                heavy.clear()  # one client left: a replica drains and goes
                two = dict(pids)
                assert wait_for(lambda: sum(map(alive, two.values())) == 1, 120), "no replica was scaled down"
                [survivor] = [r for r, pid in two.items() if alive(pid)]
                after = {_complete(url, f"{i} after the load " * 6).headers["x-hybridrt-replica"] for i in range(6)}
            finally:
                done.set()  # the clients stop (a failed assertion above must not leave them asking)
            for c in clients:
                c.result()
    assert after == {survivor}
    assert not failed, failed[:3]
