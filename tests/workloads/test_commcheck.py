"""The fabric check: nccl-tests' figures, its sweep, its verdict, its command line, and a real 2-rank gloo run."""

from __future__ import annotations

import io
import json
import re
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch.distributed as dist
from trainer_launch import subprocess_env
from trainyard_train import commcheck
from trainyard_train.commcheck import Result, bus_factor, parse_args, sizes, topology_line, verdict

# A row of the table: size, count, type, redop, time (us), algbw, busbw, #wrong.
ROW = re.compile(r"\s+(\d+)\s+(\d+)\s+float\s+sum\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)")


def test_bus_bandwidth_is_nccl_tests_all_reduce_correction() -> None:
    # doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n; 1 for two ranks, 1.875 for two p5 nodes (16 ranks).
    assert bus_factor(2) == 1.0
    assert bus_factor(16) == 1.875
    result = Result(size=1_000_000_000, seconds=0.5, ranks=16, wrong=0)
    assert result.algbw == 2.0
    assert result.busbw == 3.75


def test_sweep_doubles_from_min_and_always_ends_at_max() -> None:
    assert sizes(8, 64, 2) == [8, 16, 32, 64]
    assert sizes(8, 100, 4) == [8, 32, 100]
    assert sizes(1024, 1024, 2) == [1024]
    assert len(sizes(8, 1024**3, 2)) == 28


def test_threshold_applies_to_the_largest_size() -> None:
    fast_small = Result(size=8, seconds=1e-9, ranks=2, wrong=0)
    slow_large = Result(size=1024, seconds=1.0, ranks=2, wrong=0)
    code, text = verdict([fast_small, slow_large], min_busbw=1.0)
    assert code == 1 and "FAIL" in text
    code, text = verdict([slow_large, fast_small], min_busbw=1.0)
    assert code == 0 and "PASS" in text
    assert verdict([slow_large], min_busbw=0.0)[0] == 0


def test_wrong_results_fail_even_without_a_threshold() -> None:
    code, text = verdict([Result(size=8, seconds=1.0, ranks=2, wrong=2)], min_busbw=0.0)
    assert code == 1 and "2 elements came back wrong" in text


def test_sizes_take_binary_suffixes() -> None:
    args = parse_args(["--min-bytes", "8", "--max-bytes", "1G", "--min-busbw-gbps", "92.5"])
    assert (args.min_bytes, args.max_bytes, args.min_busbw_gbps) == (8, 1024**3, 92.5)
    assert parse_args(["--max-bytes", "64K"]).max_bytes == 65536


@pytest.mark.parametrize(("argv", "names"), [
    (["--iters", "0"], "--iters"),
    (["--max-bytes", "1X"], "--max-bytes"),
    (["--min-bytes", "6"], "--min-bytes"),
    (["--min-busbw-gbps", "-1"], "--min-busbw-gbps"),
    (["--min-busbw-gbps", "nan"], "--min-busbw-gbps"),
    (["--step-factor", "1"], "--step-factor"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "--max-bytes"),
    (["--bogus"], "--bogus"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m trainyard_train.commcheck: error:")
    assert names in err


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "trainyard_train.commcheck", "--max-bytes", "1M", "--warmup-iters", "1", "--iters", "3", *args]
    return subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_two_gloo_ranks_print_real_bus_bandwidth() -> None:
    done = _run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backend gloo, 2 ranks" in done.stdout
    rows = [ROW.fullmatch(line) for line in done.stdout.splitlines()]
    table = [m.groups() for m in rows if m]
    assert [int(r[0]) for r in table] == sizes(8, 1024**2, 2)
    size, count, time_us, algbw, busbw, wrong = table[-1]
    assert int(count) * 4 == int(size) and float(time_us) > 0 and wrong == "0"
    # Two ranks: busbw equals algbw (factor 2(n-1)/n = 1), and a real transfer is never free.
    assert float(busbw) == float(algbw) > 0
    assert all(r[5] == "0" for r in table)


@pytest.mark.slow
def test_an_unreachable_threshold_fails_the_run() -> None:
    done = _run("--min-busbw-gbps", "100000")
    assert done.returncode != 0
    assert re.search(r"# FAIL: busbw [\d.]+ GB/s at 1048576 B < threshold 100000.000 GB/s", done.stdout), done.stdout


# --- where the ranks ran: the nodes' shared network layers ------------------------------------------------------

LAYERS = ["topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2",
          "topology.k8s.aws/network-node-layer-3"]


def _node(*values: str) -> dict[str, str]:
    return dict(zip(LAYERS, values, strict=False))


def test_topology_line_names_the_layers_both_nodes_share() -> None:
    same_spine = {"ip-1": _node("nn-a", "nn-b", "nn-c"), "ip-2": _node("nn-a", "nn-b", "nn-d")}
    assert topology_line(same_spine, LAYERS) == (
        "# topology: 2 nodes share topology.k8s.aws/network-node-layer-1=nn-a, "
        "topology.k8s.aws/network-node-layer-2=nn-b; they differ from topology.k8s.aws/network-node-layer-3")
    one_switch = {"ip-1": _node("nn-a", "nn-b", "nn-c"), "ip-2": _node("nn-a", "nn-b", "nn-c")}
    assert topology_line(one_switch, LAYERS).endswith("layer-3=nn-c")
    apart = {"ip-1": _node("nn-a"), "ip-2": _node("nn-x")}
    assert topology_line(apart, LAYERS) == ("# topology: 2 nodes share no layer; they differ from "
                                            "topology.k8s.aws/network-node-layer-1")
    g5 = {"ip-1": {}, "ip-2": _node("nn-a")}
    assert "no topology.k8s.aws/network-node-layer-1 label on ip-1" in topology_line(g5, LAYERS)
    assert topology_line({"ip-1": "forbidden"}, LAYERS) == "# topology: unknown (ip-1: forbidden)"


def test_node_labels_come_from_the_api_server_with_the_service_account(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path
    (account / "token").write_text("secret-token\n")
    (account / "ca.crt").write_text("")
    seen: dict[str, object] = {}

    def urlopen(request: urllib.request.Request, context: object, timeout: float) -> io.BytesIO:
        seen.update(url=request.full_url, auth=request.get_header("Authorization"), timeout=timeout)
        return io.BytesIO(json.dumps({"metadata": {"labels": _node("nn-a")}}).encode())

    monkeypatch.setattr(ssl, "create_default_context", lambda cafile: seen.setdefault("ca", cafile))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.100.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert commcheck.node_labels("ip-1.ec2.internal", account) == _node("nn-a")
    assert seen == {"ca": str(account / "ca.crt"), "url": "https://10.100.0.1:443/api/v1/nodes/ip-1.ec2.internal",
                    "auth": "Bearer secret-token", "timeout": 10}
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(OSError, match="not in a cluster"):
        commcheck.node_labels("ip-1", account)


def test_one_rank_reports_why_it_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.delenv(commcheck.NODE_ENV, raising=False)
        assert commcheck.report_topology(LAYERS, 0) == "# topology: unknown (rank 0: $NODE_NAME not set)"
        monkeypatch.setenv(commcheck.NODE_ENV, "ip-1")
        monkeypatch.setattr(commcheck, "node_labels", lambda name: _node("nn-a", "nn-b", "nn-c"))
        assert commcheck.report_topology(LAYERS, 0) == (
            "# topology: 1 node has topology.k8s.aws/network-node-layer-1=nn-a, "
            "topology.k8s.aws/network-node-layer-2=nn-b, topology.k8s.aws/network-node-layer-3=nn-c")
    finally:
        dist.destroy_process_group()
