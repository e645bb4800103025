"""The service's page in real Chromium (Debian's, driven by Playwright; see tests/browser.py), against a real
`reach serve` whose model answers through a real HTTP endpoint 0.3 s late, so a run lasts long enough to watch:

- ask the demo question and watch it: the running step's pieces, then each step as the viewer's card, then the answer;
- reload the page mid-run: the run shows again from its start and is followed to its end;
- cancel a run: it ends `stopped`;
- in light and dark, at 800 and 1280 px: every visible text has a contrast of at least 4.5:1, nothing overflows
  sideways, the console stays clean. Screenshots in test-artifacts/service_page_*.png.
"""
from pathlib import Path

import pytest

from reach_nb.risk.analysis import SPIKE_QUESTION

from browser import CHROMIUM_ARGS, ensure_chromium, ensure_python_package, low_contrast, open_page
from reach_cli import served
from service_proc import service, small_db  # noqa: F401  (a fixture)

ARTIFACTS = Path(__file__).resolve().parents[1]/'test-artifacts'
WAIT = 60_000  # ms


@pytest.fixture(scope='module')
def browser():
    try: chromium = ensure_chromium()
    except Exception as e: pytest.fail(f'Debian Chromium is needed for the browser tests: {e}', pytrace=False)
    sync_api = ensure_python_package('playwright.sync_api', 'playwright>=1.40')
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try: yield b
        finally: b.close()


@pytest.fixture(scope='module')
def site(tmp_path_factory, small_db):
    with served('sim-analyst', '--latency', '0.3') as model:
        tmp = tmp_path_factory.mktemp('serve')
        with service(tmp, small_db, '--model', 'openai:sim-analyst', '--base-url', model) as (base, _):
            yield base


def ask(page, question=SPIKE_QUESTION, agent='react'):
    page.fill('#question', question)
    page.select_option('#agent', agent)
    page.click('#start')


def wide(page) -> int:
    "How far the page reaches past the window's width, in pixels (0: nothing overflows sideways)."
    return page.evaluate('() => document.documentElement.scrollWidth - document.documentElement.clientWidth')


@pytest.mark.parametrize('scheme', ['light', 'dark'])
@pytest.mark.parametrize('width', [800, 1280])
def test_watch_a_run_to_its_answer(browser, site, scheme, width):
    page = open_page(browser, site + '/', scheme, width)
    # the running step's pieces show before its card: count the times the live area, shown, is hidden again
    # (a record with no old value: `hidden` was added where it was absent)
    page.evaluate("""() => { window.liveShown = 0;
        new MutationObserver(rs => { window.liveShown += rs.filter(r => r.oldValue === null).length; })
          .observe(document.querySelector('#live'), {attributes: true, attributeFilter: ['hidden'],
                                                     attributeOldValue: true}); }""")
    ask(page)
    page.wait_for_selector('#steps .reach-step', timeout=WAIT)
    page.wait_for_selector('#end .reach-answer, #end *', timeout=WAIT)
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Finished')", timeout=WAIT)
    assert page.text_content('#status') == 'Finished: answer'
    assert 'c09' in page.text_content('#end')
    assert page.locator('#steps .reach-step').count() >= 3
    assert page.evaluate('window.liveShown') >= 1  # shown while a step ran, hidden when its card came
    assert page.get_attribute('html', 'data-theme') == scheme
    checked, low = low_contrast(page)
    assert checked > 20 and not low, low[:5]
    assert wide(page) == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS/f'service_page_{scheme}_{width}.png'), full_page=True)
    assert page.errors == []
    page.context.close()


def test_a_reloaded_page_follows_its_run(browser, site):
    page = open_page(browser, site + '/')
    ask(page)
    page.wait_for_selector('#steps .reach-step', timeout=WAIT)
    before = page.locator('#steps .reach-step').count()
    assert page.text_content('#status').startswith('Running'), 'the run ended before the reload'
    page.reload()
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Finished')", timeout=WAIT)
    steps = page.locator('#steps .reach-step')
    assert steps.count() >= before and page.text_content('#status') == 'Finished: answer'
    indexes = [int(steps.nth(i).get_attribute('data-step')) for i in range(steps.count())]
    assert indexes == sorted(set(indexes)), indexes  # each step once, in order
    assert page.errors == []
    page.context.close()


def test_cancel_stops_the_run(browser, site):
    page = open_page(browser, site + '/', 'dark', 800)
    ask(page)
    page.wait_for_selector('#steps .reach-step', timeout=WAIT)
    page.click('#cancel')
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Finished')", timeout=WAIT)
    assert page.text_content('#status') == 'Finished: stopped'
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS/'service_page_cancelled_dark_800.png'), full_page=True)
    assert page.errors == []
    page.context.close()


def test_a_refused_question_is_said_on_the_page(browser, site):
    page = open_page(browser, site + '/')
    ask(page, question='x' * 4001)
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Error')", timeout=WAIT)
    assert 'question' in page.text_content('#status') and page.get_attribute('#status', 'class') == 'failed'
    page.context.close()
