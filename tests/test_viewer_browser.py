"""The RunViewer in a real JupyterLab, in a real browser: JupyterLab runs headless on localhost, Debian's Chromium
(driven by Playwright) opens a notebook that shows a RunViewer over the risk demo's run, clicks "next" and must
see the next step's thought. A screenshot is kept in test-artifacts/viewer_next.png.

The set-up installs what is missing: Debian's `chromium` package (apt-get, as root) and nothing else; the
`playwright` Python package comes from the dev extras and drives Chromium through `executable_path`
(never `playwright install`).
"""
from pathlib import Path

import pytest

from reach_nb.risk_data import ensure_dataset
from reach_nb.sim_analyst import run_risk_demo

from browser import CHROMIUM_ARGS, TOKEN, ensure_chromium, ensure_python_package, jupyterlab, write_notebook

ARTIFACTS = Path(__file__).resolve().parents[1]/'test-artifacts'
SHOT = ARTIFACTS/'viewer_next.png'
WAIT = 60_000  # ms: each of kernel, cells, widget

NOTEBOOK = """\
from reach_nb.viewer import RunViewer
from reach_nb.sim_analyst import run_risk_demo
run = run_risk_demo()
v = RunViewer(run)
v"""


@pytest.fixture(scope='session')
def chromium():
    "Debian's Chromium, installed with apt-get if it is missing; a failed install fails the test (never skips it)."
    try: return ensure_chromium()
    except Exception as e: pytest.fail(f'Debian Chromium is needed for the browser tests: {e}', pytrace=False)


@pytest.fixture(scope='module')
def db():
    return ensure_dataset()


@pytest.fixture(scope='module')
def demo_run(db):
    "The run the notebook shows: the risk demo is deterministic, so the test makes the same one."
    return run_risk_demo(db=db)


@pytest.fixture(scope='module')
def lab(tmp_path_factory, db):
    "A headless JupyterLab serving a folder with viewer.ipynb (its kernel reads the same dataset); yields its base URL."
    root, home = tmp_path_factory.mktemp('lab_root'), tmp_path_factory.mktemp('lab_home')
    write_notebook(root/'viewer.ipynb', NOTEBOOK)
    with jupyterlab(root, home, REACH_DATA_DB=str(db)) as base: yield base


@pytest.fixture
def page(chromium, tmp_path):
    "A page in headless Debian Chromium with a fresh profile."
    try: sync_api = ensure_python_package('playwright.sync_api', 'playwright>=1.40')
    except Exception as e: pytest.fail(f'Playwright is needed for the browser tests: {e}', pytrace=False)
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(tmp_path/'profile', executable_path=str(chromium), headless=True,
                                                   args=CHROMIUM_ARGS, viewport={'width': 1280, 'height': 900})
        try: yield ctx.pages[0] if ctx.pages else ctx.new_page()
        finally: ctx.close()


KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.content.widgets.length > 0;
}"""


def open_and_run(page, base:str):
    "Open viewer.ipynb in JupyterLab, wait for an idle kernel and run all cells."
    page.goto(f'{base}/lab/tree/viewer.ipynb?token={TOKEN}')
    page.wait_for_function(KERNEL_IDLE, timeout=WAIT)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def notebook_output(page) -> str:
    "The text of the notebook's outputs, to say why a widget did not show."
    return '\n'.join(page.locator('.jp-OutputArea-output').all_inner_texts())[-3000:]


def test_next_shows_the_next_thought(lab, page, demo_run):
    from playwright.sync_api import Error as PlaywrightError, expect
    first, second, n = demo_run.steps[0].thought, demo_run.steps[1].thought, len(demo_run.steps)
    assert n >= 2 and first and second and first not in second
    errors = []
    page.on('pageerror', lambda e: errors.append(str(e)))
    try:
        open_and_run(page, lab)
        thought = page.locator('.reach-thought')
        expect(thought).to_be_visible(timeout=WAIT)
        expect(thought).to_contain_text(first)
        expect(page.locator('.reach-header')).to_contain_text(f'step 1 of {n}')
        page.locator('.reach-next').click()
        expect(thought).to_contain_text(second, timeout=10_000)
        expect(thought).not_to_contain_text(first)
        expect(page.locator('.reach-header')).to_contain_text(f'step 2 of {n}')
        body = page.locator('body').inner_text()
        assert 'Error displaying widget' not in body and 'Traceback' not in body, body[-2000:]
    except (AssertionError, PlaywrightError) as e:
        raise AssertionError(f'{e}\n--- notebook output ---\n{notebook_output(page)}') from None
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOT))
    assert not errors, errors
