"""Shared by the MCP tests: our test server, and third-party MCP servers and clients installed on demand.

The Python servers come from PyPI (and the dev extras); the npm ones (the official `server-everything` and the MCP
Inspector's command-line client) are installed with npm into a cache folder the first time a test needs them."""
import os, subprocess, sys
from pathlib import Path

from browser import ensure_python_package, free_port  # noqa: F401  (re-exported for the tests)

HERE = Path(__file__).parent
FAULTS = HERE / 'fault_server.py'
MODELS = HERE / 'model_server.py'
SERVE_RISK = 'from reach_nb.mcp_tools import serve_mcp; serve_mcp()'
NPM_DIR = Path(os.environ.get('REACH_NPM_CACHE', Path.home() / '.cache' / 'reach_nb' / 'npm'))
# Pinned: the Inspector's 0.21 line runs on Node 20 (later lines ask for Node 22).
INSPECTOR = ('@modelcontextprotocol/inspector@0.21.2', 'mcp-inspector')
EVERYTHING = ('@modelcontextprotocol/server-everything@2026.8.31', 'mcp-server-everything')


def fault_spec(*args:str, **more) -> dict:
    "An `mcpServers` entry that starts the fault server."
    return {'command': sys.executable, 'args': [str(FAULTS), *args], **more}


def ensure_npm(package:tuple[str, str]) -> Path:
    "The path of an npm package's program, installing the package into `NPM_DIR` first if it is missing."
    spec, program = package
    path = NPM_DIR / 'node_modules' / '.bin' / program
    if not path.exists():
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        cmd = ['npm', 'install', '--prefix', str(NPM_DIR), '--no-audit', '--no-fund', '--loglevel=error', spec]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode or not path.exists():
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}); install {spec} by hand.\n{r.stderr[-2000:]}")
    return path
