"""twinkle.engines.vllm: lazy vLLM, install hint, and the port/env wiring (without vLLM)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from twinkle.engines import (
    EnginePool,
    PortRegistry,
    VllmConfig,
    VllmEngine,
    VllmNotInstalledError,
    VllmPorts,
    vllm_engine_factory,
)
from twinkle.engines.vllm import vllm_command
from twinkle.errors import InvalidArgumentError, TwinkleError
from twinkle.perf import TimeRecorder

HAS_VLLM = importlib.util.find_spec("vllm") is not None

# Stands in for ``python -m vllm.entrypoints.openai.api_server``: binds its HTTP port and,
# like vLLM's distributed set-up, VLLM_PORT and MASTER_PORT by number; reports its env.
FAKE_API_SERVER = textwrap.dedent(
    """
    import argparse, http.server, json, os, socket
    parser = argparse.ArgumentParser()
    for opt in ("--model", "--host"):
        parser.add_argument(opt)
    parser.add_argument("--port", type=int)
    args, extra = parser.parse_known_args()
    held = []
    for var in ("VLLM_PORT", "MASTER_PORT"):
        s = socket.socket(); s.bind(("", int(os.environ[var]))); s.listen(); held.append(s)
    report = {k: os.environ.get(k) for k in ("VLLM_PORT", "MASTER_PORT", "MASTER_ADDR",
                                               "CUDA_VISIBLE_DEVICES", "EXTRA")}
    report.update(model=args.model, port=args.port, extra=extra)
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(report).encode() if self.path == "/report" else b"ok"
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer((args.host, args.port), Handler).serve_forever()
    """
)


def test_importing_twinkle_engines_does_not_import_vllm() -> None:
    code = "import sys, twinkle.engines; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_asking_for_the_adapter_without_vllm_says_how_to_install_it() -> None:
    with pytest.raises(VllmNotInstalledError) as info:
        vllm_engine_factory(VllmConfig(model="Qwen/Qwen2.5-0.5B"))
    assert isinstance(info.value, ImportError) and isinstance(info.value, TwinkleError)
    assert "pip install 'twinkle[vllm]'" in str(info.value)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_the_check_asks_the_engines_interpreter_not_this_one() -> None:
    with pytest.raises(VllmNotInstalledError, match="does not find vLLM") as info:
        vllm_engine_factory(VllmConfig(model="m", python=sys.executable))
    assert repr(sys.executable) in str(info.value) and "make vllm-venv" in str(info.value)


def test_an_interpreter_that_cannot_run_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(VllmNotInstalledError, match="could not be asked") as info:
        vllm_engine_factory(VllmConfig(model="m", python=missing))
    assert repr(missing) in str(info.value)


def test_engines_report_no_usage_statistics_unless_asked() -> None:
    ports = VllmPorts(api_port=20000, master_port=20001, internal_base_port=20002, internal_ports=1)
    _, env = vllm_command(VllmConfig(model="m"), ports, base_env={})
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    asked = VllmConfig(model="m", env={"VLLM_NO_USAGE_STATS": "0"})
    assert vllm_command(asked, ports, base_env={})[1]["VLLM_NO_USAGE_STATS"] == "0"


def test_each_engine_gets_its_reserved_ports_in_its_environment(tmp_path: Path) -> None:
    registry = PortRegistry(tmp_path, port_range=(15000, 19999))  # below the host-wide range
    config = VllmConfig(model="m", devices="1,3", env={"MASTER_ADDR": "10.0.0.1"})
    with registry.reserve(2 + config.internal_ports, contiguous=True) as res:
        ports = VllmPorts.from_reservation(res)
    argv, env = vllm_command(config, ports, base_env={"PATH": "/bin", "VLLM_PORT": "1"})
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == str(ports.api_port) == str(res.ports[0])
    assert env["MASTER_PORT"] == str(ports.master_port)
    assert env["VLLM_PORT"] == str(ports.internal_base_port)  # ours, not the inherited "1"
    assert ports.internal_base_port + config.internal_ports - 1 == res.ports[-1]
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["PATH"] == "/bin"


def test_config_refuses_settings_that_would_bypass_the_reservation() -> None:
    with pytest.raises(InvalidArgumentError, match="VLLM_PORT"):
        VllmConfig(model="m", env={"VLLM_PORT": "8000"})
    with pytest.raises(InvalidArgumentError, match="--port"):
        VllmConfig(model="m", args=("--port=8000",))
    with pytest.raises(InvalidArgumentError, match="internal_ports="):
        VllmConfig(model="m", internal_ports=0)


def test_concurrent_fake_vllm_servers_start_on_distinct_reserved_ports(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    server = fake / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for pkg in (fake / "vllm", fake / "vllm" / "entrypoints", server):
        (pkg / "__init__.py").write_text("")
    (server / "api_server.py").write_text(FAKE_API_SERVER)
    config = VllmConfig(
        model="tiny",
        args=("--dtype", "float32"),
        env={"PYTHONPATH": str(fake), "EXTRA": "x"},
        internal_ports=4,
        python=sys.executable,  # asked with this env, it finds the fake vllm package
        log_dir=tmp_path / "logs",
    )
    registry = PortRegistry()  # host-wide, as in production: concurrent runs coordinate
    factory = vllm_engine_factory(config, registry=registry)
    with EnginePool[VllmEngine](recorder=TimeRecorder(), start_timeout_s=60) as pool:
        engines = pool.start({f"vllm-{i}": factory for i in range(4)})
        reports = {}
        for name, engine in engines.items():
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                engine.base_url.removesuffix("/v1") + "/report", timeout=10
            ) as reply:
                reports[name] = json.loads(reply.read())
            assert reports[name]["port"] == engine.ports.api_port
            assert reports[name]["VLLM_PORT"] == str(engine.ports.internal_base_port)
            assert reports[name]["MASTER_PORT"] == str(engine.ports.master_port)
            assert reports[name]["extra"] == ["--dtype", "float32"]
            assert reports[name]["EXTRA"] == "x"
        used = [int(r[k]) for r in reports.values() for k in ("port", "VLLM_PORT", "MASTER_PORT")]
        assert len(set(used)) == 12
        pids = [e.pid for e in engines.values()]
    assert all(not _alive(pid) for pid in pids)
    assert [c for c in registry.claims() if c.pid == os.getpid()] == []
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        f"vllm-{i}.log" for i in range(4)
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
