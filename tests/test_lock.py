"""The lock: the environment the tests run in is exactly requirements.lock, and .ci/check_lock.py (which .ci/run
runs after installing) fails when the lock and the installed packages differ either way."""
import subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT/'requirements.lock'


def _check(lock:Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT/'.ci'/'check_lock.py'), '--lock', str(lock)],
                          capture_output=True, text=True, timeout=120)


def test_the_tests_run_in_the_locked_environment():
    r = _check(LOCK)
    assert r.returncode == 0, r.stderr


def test_a_lock_out_of_date_either_way_fails(tmp_path):
    lines = LOCK.read_text(encoding='utf-8').splitlines()
    pinned = [l for l in lines if '==' in l and not l.startswith('#')]
    name, version = pinned[0].split('==')
    cases = {'missing': [l for l in lines if l != pinned[0]],
             'other version': [l if l != pinned[0] else f'{name}==0.0.0' for l in lines],
             'extra': lines + ['no-such-package-reach==1.0']}
    said = {}
    for case, text in cases.items():
        (tmp_path/'lock').write_text('\n'.join(text) + '\n', encoding='utf-8')
        r = _check(tmp_path/'lock')
        assert r.returncode == 1, (case, r.stdout, r.stderr)
        said[case] = r.stderr
    assert 'is installed but not pinned' in said['missing'] and 'is pinned at 0.0.0' in said['other version']
    assert 'no-such-package-reach==1.0 is pinned but not installed' in said['extra']
    assert all('Run .ci/lock' in s for s in said.values())
