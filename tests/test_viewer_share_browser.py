"""Sharing a run, checked in real Chromium (Debian's, driven by Playwright; see tests/browser.py).

- The page `run_to_html` writes, opened from disk in the light and the dark colour scheme (`prefers-color-scheme`) at
  1280 and 800 px: every step is there, the strip and the buttons and keys move the current step, folds open and close,
  the Markdown source toggles, every visible text has a contrast of at least 4.5:1 (computed from the computed
  styles), nothing overflows sideways, and the console stays clean. A run whose texts are all markup shows them as text.
- The fork panel in a live JupyterLab, in its light and dark themes: edit an observation, press Fork, and the fork
  shows beside the original in the comparison, readable.
- A notebook saved with a RunViewer output, opened in JupyterLab with no kernel at all (the server offers none, and
  the notebook is not trusted, as one received or cloned is): the run shows as the static HTML beside the widget, in
  JupyterLab's light and dark themes, instead of "Error displaying widget".

Screenshots are kept in test-artifacts/share_*.png.
"""
import json, os, re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from reach_nb.core import Run
from reach_nb.llm.models import FaultyLLM, ScriptedLLM
from reach_nb.agents.react import ReActAgent
from reach_nb.risk.data import ensure_dataset
from reach_nb.viewer.share import run_to_html
from reach_nb.risk.agents import run_risk_demo
from reach_nb.risk.analyst import SimAnalyst

from browser import (CHROMIUM_ARGS, TOKEN, ensure_chromium, ensure_python_package, jupyterlab, low_contrast, open_page,
                     write_notebook)

ARTIFACTS = Path(__file__).resolve().parents[1]/'test-artifacts'
WAIT = 60_000  # ms

def shot(page, name:str):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS/f'share_{name}.png'), full_page=False)


@pytest.fixture(scope='session')
def chromium():
    try: return ensure_chromium()
    except Exception as e: pytest.fail(f'Debian Chromium is needed for the browser tests: {e}', pytrace=False)


@pytest.fixture(scope='module')
def browser(chromium):
    try: sync_api = ensure_python_package('playwright.sync_api', 'playwright>=1.40')
    except Exception as e: pytest.fail(f'Playwright is needed for the browser tests: {e}', pytrace=False)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try: yield b
        finally: b.close()


KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.content.widgets.length > 0;
}"""


@pytest.fixture(scope='module')
def db(): return ensure_dataset()


@pytest.fixture(scope='module')
def faulty_run(db):
    "The risk demo with 30% of the analyst's replies spoiled: safeguards fire, a parse fails, long observations fold."
    return run_risk_demo(db=db, llm=FaultyLLM(SimAnalyst(), rate=0.3, seed=3))


@pytest.fixture(scope='module')
def page_file(faulty_run, tmp_path_factory):
    return run_to_html(faulty_run, tmp_path_factory.mktemp('share')/'run.html')


def norm(s:str) -> str: return ' '.join(s.split())


def current(page) -> int:
    "The position (1-based) the page says it is at, checked against the outlined step and the marked chip."
    pos = int(re.fullmatch(r'step (\d+) of \d+', page.locator('#reach-pos').inner_text())[1])
    marked = page.evaluate("""() => [[...document.querySelectorAll('main > .reach-step')].findIndex(s => s.classList.contains('reach-current')),
        [...document.querySelectorAll('.reach-strip a')].findIndex(a => a.hasAttribute('aria-current'))]""")
    assert marked == [pos - 1, pos - 1], (pos, marked)
    return pos


def in_view(page, k:int) -> bool:
    "Whether the top of step `k` (1-based) is in the window, below the sticky bar."
    box = page.locator('main > .reach-step').nth(k - 1).bounding_box()
    bar = page.locator('.reach-bar').bounding_box()
    return bar['height'] - 2 <= box['y'] < 900


@pytest.mark.parametrize('width', [1280, 800])
@pytest.mark.parametrize('scheme', ['light', 'dark'])
def test_page_steps_folds_navigation_contrast(browser, page_file, faulty_run, scheme, width):
    from playwright.sync_api import expect
    n = len(faulty_run.steps)
    page = open_page(browser, page_file.as_uri(), scheme, width)
    try:
        shot(page, f'page_{scheme}_{width}_top')
        steps = page.locator('main > .reach-step')
        expect(steps).to_have_count(n)
        for k, s in enumerate(faulty_run.steps):
            expect(steps.nth(k)).to_contain_text(f'step {s.index}')
            if s.thought: assert norm(s.thought) in norm(steps.nth(k).inner_text()), k
        expect(page.locator('.reach-strip a')).to_have_count(n)
        assert norm(faulty_run.answer[:200]) in norm(page.locator('.reach-answer').inner_text())
        assert page.evaluate('matchMedia("(prefers-color-scheme: dark)").matches') == (scheme == 'dark')

        # navigation: buttons, chips, keys
        assert current(page) == 1 and page.locator('#reach-prev').is_disabled()
        page.locator('#reach-next').click()
        assert current(page) == 2 and in_view(page, 2)
        page.locator('.reach-strip a').nth(5).click()
        assert current(page) == 6 and in_view(page, 6)
        page.keyboard.press('ArrowLeft')
        assert current(page) == 5 and in_view(page, 5)
        page.keyboard.press('j')
        assert current(page) == 6
        page.locator('.reach-strip a').nth(n - 1).click()
        assert current(page) == n and page.locator('#reach-next').is_disabled()
        page.keyboard.press('ArrowRight')
        assert current(page) == n

        # folds: a long observation opens on a click; all folds open and close
        fold = page.locator('main .reach-action details.reach-fold').first
        rest = fold.locator(':scope > :last-child')
        expect(rest).to_be_hidden()
        fold.locator(':scope > summary').click()
        expect(rest).to_be_visible()
        expect(fold.locator('.reach-more')).to_be_hidden()
        total = page.locator('main details').count()
        page.locator('#reach-close').click()
        assert page.evaluate("document.querySelectorAll('main details[open]').length") == 0
        page.locator('#reach-open').click()
        assert page.evaluate("document.querySelectorAll('main details[open]').length") == total > 5

        # the Markdown source, a toggle away
        source = page.locator('main .reach-md > .reach-source').first
        expect(source).to_be_hidden()
        page.locator('#reach-raw').click()
        expect(source).to_be_visible()
        expect(page.locator('#reach-raw')).to_have_attribute('aria-pressed', 'true')
        page.locator('#reach-raw').click()
        expect(source).to_be_hidden()

        # every visible text readable, everything open; nothing wider than the window
        checked, bad = low_contrast(page)
        assert checked > 200 and not bad, f'{len(bad)} of {checked} texts below 4.5:1, worst first: {bad[:8]}'
        assert page.evaluate('document.documentElement.scrollWidth <= innerWidth'), 'the page overflows sideways'
        page.locator('#reach-close').click()
        page.locator('.reach-strip a').nth(2).click()
    finally:
        shot(page, f'page_{scheme}_{width}')
        page.context.close()
    assert not page.errors, page.errors


EVIL = '</textarea><script>alert(1)</script><img src=x onerror=alert(2)><b>bold?</b>'


def test_hostile_texts_are_text(browser, tmp_path):
    def echo(text:str): # anything
        "Say the text back."
        return text
    say = lambda **d: json.dumps(d)
    run = ReActAgent(ScriptedLLM([say(thought=EVIL, action={'tool': 'echo', 'args': {'text': EVIL}}),
                                  say(thought=EVIL, answer=EVIL)]), [echo]).run(EVIL)
    page = open_page(browser, run_to_html(run, tmp_path/'evil.html').as_uri())
    try:
        body = page.locator('body').inner_text()
        assert body.count(EVIL) >= 5, body[:2000]  # question, thoughts, observation, answer: as written
        injected = "[...document.querySelectorAll('img, textarea, b')].filter(e => e.tagName !== 'B' || e.textContent === 'bold?')"
        assert page.evaluate(f'{injected}.length') == 0
        assert page.evaluate('document.scripts.length') == 1
    finally:
        shot(page, 'page_hostile')
        page.context.close()
    assert not page.errors, page.errors


# Script and markup a model or a tool may send, each setting window.__owned (or opening a dialog) if it ever ran.
VECTORS = ['<script>window.__owned=1</script>', '<img src=x onerror="window.__owned=1">', '<svg onload=window.__owned=1>',
           '"><img src=x onerror=window.__owned=1>', "'><svg/onload=window.__owned=1>", '</textarea><script>alert(1)</script>',
           '</script><script>window.__owned=1</script>', '<iframe srcdoc="<script>parent.__owned=1</script>"></iframe>',
           '[link](javascript:window.__owned=1)', '<a href="javascript:window.__owned=1">x</a>',
           '<details open ontoggle=window.__owned=1>', '<body onload=window.__owned=1>', '<style>*{display:none}</style>',
           '<math><mtext><table><mglyph><style><img src=x onerror=window.__owned=1>', '<!--><img src=x onerror=alert(2)>',
           '<object data="javascript:window.__owned=1"></object>']
CHECKS = """() => ({owned: window.__owned === 1, scripts: document.scripts.length,
  handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
  js_links: document.querySelectorAll('[href^="javascript:"], [src^="javascript:"], [data^="javascript:"]').length,
  frames: document.querySelectorAll('iframe, object, embed').length, hidden: getComputedStyle(document.body).display})"""


def _hostile_run(payload:str) -> Run:
    "A ReAct run whose every text holds `payload`: question, thoughts, a reply that is not JSON, an invented tool name,"
    " an invented argument, observations as text, JSON and Markdown, and the answer (text, table and code)."
    def echo(text:str): # anything
        "Say the text back."
        return text
    def as_json(text:str): # anything
        "The text inside JSON."
        return json.dumps({'found': text, 'rows': [[text, 1]]})
    say = lambda **d: json.dumps(d)
    replies = [f'Let me think. {payload}', say(thought=payload, action={'tool': payload, 'args': {}}),
               say(thought=payload, action={'tool': 'echo', 'args': {payload: payload}}),
               say(thought=payload, action={'tool': 'echo', 'args': {'text': f'| a | b |\n|---|---|\n| {payload} | 1 |'}}),
               say(thought=payload, action={'tool': 'as_json', 'args': {'text': payload}}),
               say(thought=payload, answer=f'{payload}\n\n| x |\n|---|\n| {payload} |\n\n```\n{payload}\n```')]
    return ReActAgent(ScriptedLLM(replies), [echo, as_json], max_steps=8).run(payload)


def test_every_payload_is_inert_in_every_page(browser, tmp_path):
    from reach_nb.viewer.share import compare_to_html
    pages, seen = [], 0
    for i, v in enumerate(VECTORS):
        run = _hostile_run(v)
        pages += [run_to_html(run, tmp_path/f'run{i}.html'), compare_to_html(run, run, tmp_path/f'cmp{i}.html')]
    for path in pages:
        page = open_page(browser, path.as_uri())
        dialogs = []
        page.on('dialog', lambda d: (dialogs.append(d.message), d.dismiss()))
        try:
            page.wait_for_timeout(50)
            got = page.evaluate(CHECKS)
            assert (got['owned'], dialogs, got['scripts'], got['handlers'], got['js_links'], got['frames'],
                    got['hidden']) == (False, [], 1, 0, 0, 0, 'block'), (path.name, got, dialogs)
            seen += 1
        finally: page.context.close()
    assert seen == 2 * len(VECTORS) == 32


NOTEBOOK = ["""\
from reach_nb.viewer.widget import RunViewer  # its output carries the run as static HTML too, share imported or not
from reach_nb.risk.agents import run_risk_demo""",
            "run = run_risk_demo()\nRunViewer(run)"]


@pytest.fixture(scope='module')
def saved_notebook(db, tmp_path_factory):
    "viewer.ipynb, executed with a real kernel, saved as nbdev-clean and JupyterLab leave it: no widget state, unsigned."
    root = tmp_path_factory.mktemp('lab_root')
    path = write_notebook(root/'viewer.ipynb', *NOTEBOOK)
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get('REACH_DATA_DB')
    os.environ['REACH_DATA_DB'] = str(db)
    try: NotebookClient(nb, kernel_name='python3', timeout=600, store_widget_state=False,
                        resources={'metadata': {'path': str(root)}}).execute()
    finally:
        if old is None: os.environ.pop('REACH_DATA_DB')
        else: os.environ['REACH_DATA_DB'] = old
    nb.metadata.pop('widgets', None)
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope='module')
def lab_without_kernels(saved_notebook, tmp_path_factory):
    "A headless JupyterLab serving the saved notebook that can start no kernel at all."
    home = tmp_path_factory.mktemp('lab_home')
    (home/'config').mkdir()
    (home/'config'/'jupyter_server_config.json').write_text(
        json.dumps({'KernelSpecManager': {'allowed_kernelspecs': ['no-such-kernel']}}))
    with jupyterlab(saved_notebook.parent, home) as base: yield base


@pytest.mark.parametrize('theme', ['JupyterLab Light', 'JupyterLab Dark'])
def test_saved_notebook_shows_the_run_without_a_kernel(browser, saved_notebook, lab_without_kernels, db, theme):
    from playwright.sync_api import expect
    run = run_risk_demo(db=db)  # deterministic: the run the notebook shows
    out = nbformat.read(saved_notebook, as_version=4).cells[1].outputs[0]['data']
    assert {'application/vnd.jupyter.widget-view+json', 'text/html'} <= set(out)
    name = theme.split()[-1].lower()
    page = open_page(browser, f'{lab_without_kernels}/lab/workspaces/{name}/tree/viewer.ipynb?reset&token={TOKEN}')
    try:
        page.locator('.jp-Dialog-button.jp-mod-reject').click(timeout=WAIT)  # "Select Kernel": No Kernel
        page.evaluate('t => window.jupyterapp.commands.execute("apputils:change-theme", {theme: t})', theme)
        page.wait_for_function('t => document.body.dataset.jpThemeName === t', arg=theme, timeout=WAIT)
        static = page.locator('.jp-OutputArea-output .reach-static')
        expect(static).to_be_visible(timeout=WAIT)
        steps = static.locator('.reach-step')
        expect(steps).to_have_count(len(run.steps))
        for k, s in enumerate(run.steps): assert norm(s.thought) in norm(steps.nth(k).inner_text()), k
        text = norm(static.inner_text())
        assert norm(run.answer[:200]) in text and 'SIMULATED RUN' in text and f'{len(run.steps)} steps' in text
        assert static.locator('.reach-source').count() > 0
        expect(static.locator('.reach-source').first).to_be_hidden()  # readable without the style sheet
        body = page.locator('body').inner_text()
        assert 'Error displaying widget' not in body and 'Loading widget' not in body, body[-1500:]
        checked, bad = low_contrast(page, '.jp-OutputArea-output')
        assert checked > 50 and not bad, f'{len(bad)} of {checked} texts below 4.5:1, worst first: {bad[:8]}'
    finally:
        shot(page, f'notebook_no_kernel_{name}')
        page.context.close()
    assert not page.errors, page.errors


FORK_NOTEBOOK = ["""\
import json, re
from reach_nb.llm.models import FunctionLLM
from reach_nb.agents.react import ReActAgent
from reach_nb.viewer.share import ForkViewer
STATS = {'c09': 'Channel c09: 212 accounts paid through 3 devices; 41% of top-ups refunded.',
         'c12': 'Channel c12: 1,940 accounts paid through 1,902 devices; 2% of top-ups refunded.'}
def channel_stats(channel:str): # a payment channel id
    "Accounts, devices and refunds of one payment channel."
    return STATS[channel]
SEEN = re.compile(r'Channel (c\\d+): ([\\d,]+) accounts paid through ([\\d,]+) devices')
def analyst(messages, **kw):
    seen = {m[1]: int(m[2].replace(',', '')) / int(m[3].replace(',', ''))
            for msg in messages[1:] for m in SEEN.finditer(str(msg.get('content')))}
    if todo := [c for c in ('c09', 'c12') if c not in seen]:
        return json.dumps({'thought': f'Look up {todo[0]}.', 'action': {'tool': 'channel_stats', 'args': {'channel': todo[0]}}})
    rings = [c for c, r in seen.items() if r >= 10]
    return json.dumps({'thought': 'Both looked up.', 'answer': f"Ring: {', '.join(rings)}." if rings else 'No ring.'})
agent = lambda: ReActAgent(FunctionLLM(analyst), [channel_stats])
original = agent().run('Which channel looks like a proxy-recharge ring, c09 or c12?')""",
                 "ForkViewer(original, agent())"]


@pytest.fixture(scope='module')
def lab_with_kernel(tmp_path_factory):
    root, home = tmp_path_factory.mktemp('fork_root'), tmp_path_factory.mktemp('fork_home')
    write_notebook(root/'fork.ipynb', *FORK_NOTEBOOK)
    with jupyterlab(root, home) as base: yield base


@pytest.mark.parametrize('theme,width', [('JupyterLab Light', 1280), ('JupyterLab Dark', 800)])
def test_fork_panel_shows_the_fork_beside_the_original(browser, lab_with_kernel, theme, width):
    from playwright.sync_api import expect
    name = theme.split()[-1].lower()
    page = open_page(browser, f'{lab_with_kernel}/lab/workspaces/fork{name}/tree/fork.ipynb?reset&token={TOKEN}',
                     width=width)
    try:
        page.wait_for_function(KERNEL_IDLE, timeout=WAIT)
        page.evaluate('t => window.jupyterapp.commands.execute("apputils:change-theme", {theme: t})', theme)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        text = page.locator('.reach-fork-text textarea')
        expect(text).to_have_value(re.compile('212 accounts paid through 3 devices'), timeout=WAIT)
        text.fill('Channel c09: 212 accounts paid through 200 devices; 3% of top-ups refunded.')
        page.locator('.reach-fork-button').click()
        expect(page.locator('.reach-fork-status')).to_contain_text('It stopped with answer: No ring.', timeout=WAIT)
        table = page.locator('.reach-compare-table')
        expect(page.locator('.reach-fork-status')).to_contain_text('fork 1: step 1, observation 1: channel_stats edited')
        expect(table.locator('thead')).to_contain_text('fork 1')
        rows = {r.locator('th').inner_text(): r.locator('td').all_inner_texts() for r in table.locator('tbody tr').all()}
        assert rows['answer'][:2] == ['Ring: c09.', 'No ring.'], rows
        cards = [page.locator(f'.reach-compare-card-{s}') for s in 'ab']
        expect(cards[0]).to_contain_text('212 accounts paid through 3 devices')
        expect(cards[1]).to_contain_text('212 accounts paid through 200 devices')
        checked, bad = low_contrast(page, '.reach-compare-viewer')
        assert checked > 30 and not bad, f'{len(bad)} of {checked} texts below 4.5:1, worst first: {bad[:8]}'
        wide = page.evaluate("[...document.querySelectorAll('.reach-compare-viewer *')].filter(e => "
                             "e.getBoundingClientRect().right > innerWidth + 1 && e.checkVisibility()).map(e => e.tagName + '.' + e.className + ' ' + e.getBoundingClientRect().right)")
        assert not wide, wide[:10]
        page.locator('.reach-compare-viewer').screenshot(path=str(ARTIFACTS/f'share_fork_compare_{name}_{width}.png'))
        body = page.locator('body').inner_text()
        assert 'Error displaying widget' not in body and 'Traceback' not in body, body[-1500:]
    finally:
        shot(page, f'fork_panel_{name}_{width}')
        page.context.close()
    assert not page.errors, page.errors
