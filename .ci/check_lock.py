"""Fail when requirements.lock (and, with `--lock` given more than once, requirements-local.lock) is out of date with
pyproject.toml.

Run in the environment that `pip install -c requirements.lock -e ".[dev]"` made. pip has already refused a
pin that contradicts pyproject.toml; this checks the rest: every installed package is pinned at the version
installed, and every pin is installed (a dependency added to or dropped from pyproject.toml shows here).
"""
import re, subprocess, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
_norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()

def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split('#', 1)[0].strip()
        if line:
            name, _, version = line.partition('==')
            out[_norm(name)] = version.strip()
    return out

if __name__ == '__main__':
    # one or more `--lock FILE` (their pins together), by default requirements.lock
    paths = [Path(sys.argv[i + 1]) for i, a in enumerate(sys.argv) if a == '--lock'] or [root/'requirements.lock']
    lock = {k: v for path in paths for k, v in pins(path.read_text(encoding='utf-8').splitlines()).items()}
    names = ' + '.join(p.name for p in paths)
    freeze = subprocess.run([sys.executable, '-m', 'pip', 'freeze', '--exclude-editable'],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    installed = pins(freeze)
    problems = [f'{n}=={v} is installed but not pinned' for n, v in installed.items() if n not in lock]
    problems += [f'{n} is pinned at {lock[n]} but {v} is installed' for n, v in installed.items() if n in lock and lock[n] != v]
    problems += [f'{n}=={v} is pinned but not installed' for n, v in lock.items() if n not in installed]
    if problems:
        sys.exit(f'{names} is out of date with pyproject.toml:\n  ' + '\n  '.join(sorted(problems)) +
                 '\nRun .ci/lock and commit requirements.lock.')
    print(f'{names} matches the environment ({len(lock)} packages)')
