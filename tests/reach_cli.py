"""Running the `reach` console script as a user does, for the CLI tests: a clean environment, and a local model
endpoint (`reach serve-model`) in its own process."""
import os, shutil, subprocess, time
from contextlib import contextmanager

import httpx, pytest

from browser import free_port

REACH = shutil.which('reach') or pytest.fail('the `reach` console script is not installed: pip install -e .')


def clean_env(**extra) -> dict:
    "This process's environment without any REACH_* setting or OpenAI key, plus `extra`."
    env = {k: v for k, v in os.environ.items() if not (k.startswith('REACH_') or k == 'OPENAI_API_KEY')}
    return env | extra


@contextmanager
def served(model:str, *opts, wait:float=30.0):
    ("`reach serve-model --model MODEL [OPTS]` in its own process; yields its base URL once it answers, "
     "within `wait` seconds.")
    port = free_port()
    proc = subprocess.Popen([REACH, 'serve-model', '--model', model, '--port', str(port), *opts], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f'http://127.0.0.1:{port}/v1'
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                if httpx.get(f'{base}/models', timeout=0.5).status_code == 200: break
            except httpx.HTTPError: time.sleep(0.1)
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f'serve-model did not start within {wait:g}s: exit status {proc.poll()}')
        yield base
    finally:
        proc.terminate(); proc.wait(10)


def run_reach(*args, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    "`reach ARGS` run to the end in `cwd`, with a clean environment unless `env` is given; its output captured."
    return subprocess.run([REACH, *args], cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
