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
