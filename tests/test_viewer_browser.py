"""The RunViewer in a real JupyterLab, in a real browser: JupyterLab runs headless on localhost, Debian's Chromium
(driven by Playwright) opens a notebook with four viewers — the risk demo's run, a run with safeguards whose answer is
hidden until its step, a DAG run with a plan, and a live run — and drives every control in the light and the dark
theme at 800 and 1280 pixels: chips, slider, play, folds, the raw toggle, search, the prompt, the overview, the plan,
Step and Stop. It measures what a reader sees: text contrast computed from the styles (WCAG relative luminance,
at least 4.5:1), controls that fit the width, the slider's length, and a console without errors. Screenshots of
each viewer in each theme and width are kept in test-artifacts/ (look at them).

The set-up installs what is missing: Debian's `chromium` package (apt-get, as root) and nothing else; the
`playwright` Python package comes from the dev extras and drives Chromium through `executable_path`
(never `playwright install`).
"""
import re
from pathlib import Path

import pytest

from reach_nb.risk.data import ensure_dataset
from reach_nb.risk.agents import run_risk_demo

from browser import CHROMIUM_ARGS, TOKEN, ensure_chromium, ensure_python_package, jupyterlab, write_notebook

ARTIFACTS = Path(__file__).resolve().parents[1]/'test-artifacts'
WAIT = 60_000  # ms: each of kernel, cells, widget
THEMES = {'light': 'JupyterLab Light', 'dark': 'JupyterLab Dark'}
MIN_CONTRAST = 4.5

CELLS = [
    """import json
from reach_nb.viewer.widget import RunViewer
from reach_nb.agents.dag import DAGAgent, LatencyLLM
from reach_nb.llm.models import FaultyLLM, ScriptedLLM
from reach_nb.risk.agents import risk_agent, run_risk_demo
from reach_nb.risk.analysis import SPIKE_QUESTION
from reach_nb.risk.analyst import SimAnalyst""",
    """v = RunViewer(run_risk_demo())
v.add_class('t-demo')
v""",
    """fv = RunViewer(run_risk_demo(llm=FaultyLLM(SimAnalyst(), rate=0.3, seed=9)), hide_answer=True)
fv.add_class('t-faulty')
fv""",
    """def fetch(what:str): # what to fetch
    "Fetch something, slowly."
    import time; time.sleep(0.3)
    return f'{what}: 12 flagged'
plan = json.dumps({'thought': 'orders and refunds are independent; the review needs the orders',
                   'plan': [{'id': 'orders', 'tool': 'fetch', 'args': {'what': 'orders'}},
                            {'id': 'refunds', 'tool': 'fetch', 'args': {'what': 'refunds'}},
                            {'id': 'review', 'tool': 'fetch', 'args': {'what': 'reviews of {orders}'}}]})
join = json.dumps({'thought': 'all there', 'decision': 'answer', 'answer': '12 orders and 12 refunds were flagged.'})
dv = RunViewer(DAGAgent(ScriptedLLM([plan, join]), [fetch]).run('How many orders and refunds were flagged?'))
dv.add_class('t-dag')
dv""",
    # the documented live pattern: the viewer is given the context manager and keeps the agent's dataset open
    """lv = RunViewer.live(risk_agent(LatencyLLM(SimAnalyst(), per_call=1.5, per_token=0.008)), SPIKE_QUESTION,
                    stream_tokens=True)
lv.add_class('t-live')
lv""",
]

SETTINGS = {'@jupyterlab/notebook-extension:tracker': {'windowingMode': 'none'},  # every cell in the page
            '@jupyterlab/apputils-extension:themes': {'theme': THEMES['light'], 'adaptive-theme': False}}


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
    "The run the first viewer shows: the risk demo is deterministic, so the test makes the same one."
    return run_risk_demo(db=db)


@pytest.fixture(scope='module')
def lab(tmp_path_factory, db):
    "A headless JupyterLab serving a folder with viewer.ipynb (its kernel reads the same dataset); yields its base URL."
    root, home = tmp_path_factory.mktemp('lab_root'), tmp_path_factory.mktemp('lab_home')
    write_notebook(root/'viewer.ipynb', *CELLS)
    with jupyterlab(root, home, settings=SETTINGS, REACH_DATA_DB=str(db)) as base: yield base


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


@pytest.fixture(scope='module')
def session(chromium, lab, tmp_path_factory):
    "One Chromium page with the notebook run once, shared by the tests in order; yields (page, errors)."
    try: sync_api = ensure_python_package('playwright.sync_api', 'playwright>=1.40')
    except Exception as e: pytest.fail(f'Playwright is needed for the browser tests: {e}', pytrace=False)
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(tmp_path_factory.mktemp('profile'), executable_path=str(chromium),
                                                   headless=True, args=CHROMIUM_ARGS, viewport={'width': 1280, 'height': 1000})
        page, errors = ctx.pages[0] if ctx.pages else ctx.new_page(), []
        page.on('console', lambda m: errors.append(f'console {m.type}: {m.text}') if m.type == 'error' else None)
        page.on('pageerror', lambda e: errors.append(f'page error: {e}'))
        try:
            open_and_run(page, lab)
            for name in ('demo', 'faulty', 'dag', 'live'):
                sync_api.expect(page.locator(f'.t-{name} .reach-header')).to_be_visible(timeout=WAIT)
        except Exception as e:
            ARTIFACTS.mkdir(exist_ok=True); page.screenshot(path=str(ARTIFACTS/'viewer_failed_open.png'))
            raise AssertionError(f'{e}\n--- notebook output ---\n{notebook_output(page)}') from None
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        yield page, errors
        ctx.close()


# --- measuring what a reader sees --------------------------------------------------------------------------------

CONTRAST = """([root, sel]) => {
  const parse = c => {
    let m = c.match(/^rgba?\\(([^)]+)\\)$/);
    if (m) { const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; }
    m = c.match(/^color\\(srgb ([^)]+)\\)$/);
    if (m) { const p = m[1].split(/[\\s\\/]+/).filter(Boolean).map(Number);
             return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1]; }
    return null;
  };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                     return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const out = [];
  for (const r of document.querySelectorAll(root)) for (const top of r.querySelectorAll(sel)) {
    for (const el of [top, ...top.querySelectorAll('*')]) {
      const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
      if (!own || !el.getClientRects().length || getComputedStyle(el).visibility === 'hidden') continue;
      if (el.closest('button:disabled')) continue;  // a disabled control is meant to look faint
      const bg = background(el), fg = over(parse(getComputedStyle(el).color), bg);
      const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
      out.push({text: own.slice(0, 40), ratio: (a + 0.05) / (b + 0.05), fg: fg.map(Math.round).join(','),
                bg: bg.map(Math.round).join(',')});
    }
  }
  return out;
}"""


def contrasts(page, root:str, sel:str) -> list[dict]:
    "Text contrast (WCAG 2) of every visible element with text in `sel` under `root`, from the computed styles."
    return page.evaluate(CONTRAST, [root, sel])


def assert_readable(page, root:str, sel:str, what:str, at_least:int=1):
    found = contrasts(page, root, sel)
    assert len(found) >= at_least, f'{what}: expected text to measure under {root} {sel}, found {len(found)}'
    low = [f for f in found if f['ratio'] < MIN_CONTRAST]
    assert not low, f'{what}: text contrast below {MIN_CONTRAST}:1: {low[:5]}'
    return found


OVERFLOW = """(root) => {
  const v = document.querySelector(root), box = v.getBoundingClientRect(), out = [];
  for (const el of v.querySelectorAll('.reach-row > *, .reach-strip > *, .reach-header, .reach-footer')) {
    const r = el.getBoundingClientRect();
    if (r.width && (r.right > box.right + 1 || r.left < box.left - 1)) out.push(el.className.slice(0, 60) + ' ' + Math.round(r.right));
  }
  return {overflowing: out, right: box.right, scroll: v.scrollWidth - v.clientWidth};
}"""


def set_view(page, theme:str, width:int, height:int=1000):
    "Switch JupyterLab's theme (through its settings command) and the window's width; wait until both apply."
    page.set_viewport_size({'width': width, 'height': height})
    page.evaluate("(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", THEMES[theme])
    page.wait_for_function("(t) => document.body.dataset.jpThemeName === t", arg=THEMES[theme], timeout=WAIT)
    page.wait_for_timeout(400)  # the new variables and the resize reach every widget


def shoot(page, theme:str, width:int, *names:str, tag:str=''):
    "Screenshots of the viewers, each whole: the window made tall enough, the viewer scrolled to the top of the notebook."
    ARTIFACTS.mkdir(exist_ok=True)
    size = page.viewport_size
    page.set_viewport_size({'width': width, 'height': 3000})
    try:
        for name in names:
            v = page.locator(f'.t-{name}')
            v.evaluate('e => e.scrollIntoView({block: "start"})')
            v.screenshot(path=str(ARTIFACTS/f'viewer_{name}_{theme}_{width}{tag}.png'))
    finally: page.set_viewport_size(size)


def check_page(page, errors:list):
    "No error in the browser's console, and every widget displayed."
    assert not errors, errors
    body = page.locator('body').inner_text()
    assert 'Error displaying widget' not in body and 'Traceback' not in body, body[-2000:]


# --- the tests ---------------------------------------------------------------------------------------------------

def test_controls_fit_every_width(session):
    "At 800, 1024 and 1280 px nothing sticks out of the viewer and the step slider keeps a usable length."
    page, errors = session
    for width in (800, 1024, 1280):
        set_view(page, 'light', width)
        page.locator('.t-demo').scroll_into_view_if_needed()
        fit = page.evaluate(OVERFLOW, '.t-demo')
        assert not fit['overflowing'] and fit['scroll'] <= 1, f'at {width} px: {fit}'
        slider = page.locator('.t-demo .reach-slider .noUi-target').bounding_box()
        assert slider['width'] >= 150, f'at {width} px the step slider is {slider["width"]:.0f} px long'
        tops = {round(c.bounding_box()['y']) for c in page.locator('.t-demo .reach-chip').all()}
        if width == 800: assert len(tops) > 1, 'at 800 px the chips should wrap onto more than one line'
    check_page(page, errors)


def drive_demo(page, demo_run, expect):
    "Chips, buttons, slider, play, folds kept per step, raw toggle, Markdown tables, search, prompt, chart."
    v, steps, n = page.locator('.t-demo'), demo_run.steps, len(demo_run.steps)
    header, thought = v.locator('.reach-header'), v.locator('.reach-step-panel:visible .reach-thought')
    v.locator('.reach-chip').first.click()
    expect(header).to_contain_text(f'step 1 of {n}')
    expect(thought).to_contain_text(steps[0].thought)
    v.locator('.reach-next').click()
    expect(header).to_contain_text(f'step 2 of {n}')
    expect(thought).to_contain_text(steps[1].thought)
    # the chart: a column per step, the current one marked
    expect(v.locator('.reach-chart .reach-bars').first.locator('.reach-col')).to_have_count(n)
    expect(v.locator('.reach-chart .reach-bars').first.locator('.reach-col').nth(1)).to_have_class(re.compile('reach-col-current'))
    # a fold: whole lines, the hint after the text; opened, one piece; kept open when we come back to the step
    fold = v.locator('.reach-step-panel:visible .reach-actions .reach-rendered .reach-fold').first
    if fold.get_attribute('open') is not None: fold.locator('> summary').click()
    more, preview = fold.locator('> summary > .reach-more'), fold.locator('> summary > .reach-preview')
    expect(more).to_be_visible()
    assert more.bounding_box()['y'] >= preview.bounding_box()['y'] + preview.bounding_box()['height'] - 1
    fold.locator('> summary').click()
    expect(more).to_be_hidden()
    expect(preview).to_be_hidden()
    expect(fold.locator('> summary > .reach-less')).to_be_visible()
    v.locator('.reach-chip').nth(2).click()
    expect(header).to_contain_text(f'step 3 of {n}')
    v.locator('.reach-prev').click()
    expect(header).to_contain_text(f'step 2 of {n}')
    assert fold.get_attribute('open') is not None, 'the fold opened on step 2 closed when the viewer came back to it'
    fold.locator('> summary').click()
    # raw text: Markdown as written, then rendered again
    rendered = v.locator('.reach-step-panel:visible .reach-actions .reach-rendered').first
    source = v.locator('.reach-step-panel:visible .reach-actions .reach-source').first
    expect(rendered).to_be_visible(); expect(source).to_be_hidden()
    v.locator('.reach-raw-toggle').click()
    expect(rendered).to_be_hidden(); expect(source).to_be_visible()
    v.locator('.reach-raw-toggle').click()
    expect(rendered).to_be_visible()
    # the prompt: the new messages marked
    v.locator('.reach-step-panel:visible .reach-prompt .lm-AccordionPanel-title, .reach-step-panel:visible .reach-prompt .jupyter-widget-Collapse-header').first.click()
    expect(v.locator('.reach-step-panel:visible .reach-new-label')).to_have_count(2)
    # the slider, from the keyboard
    v.locator('.reach-slider .noUi-handle').focus()
    page.keyboard.press('ArrowRight')
    expect(header).to_contain_text(f'step 3 of {n}')
    # a Markdown table, rendered as a table (step 6 reads result rows)
    v.locator('.reach-chip').nth(5).click()
    expect(header).to_contain_text(f'step 6 of {n}')
    assert v.locator('.reach-step-panel:visible .reach-markdown table').count() >= 2
    # play: one step a second to the end
    v.locator('.reach-play button').first.click()
    expect(header).to_contain_text(f'step {n} of {n}', timeout=5_000)
    expect(v.locator('.reach-play button i').first).to_have_class(re.compile('fa-play'))  # stopped at the end
    # search: the matching chips marked, the arrows go from match to match
    v.locator('.reach-search input').fill('task_0001')
    expect(v.locator('.reach-chip.reach-chip-match')).to_have_count(3)
    v.locator('.reach-first').click()
    v.locator('.reach-next-match').click()
    expect(header).to_contain_text(f'step 4 of {n}')
    expect(v.locator('.reach-matches')).to_have_text('3 steps match · this is match 1')
    v.locator('.reach-prev-match').click()
    expect(header).to_contain_text(f'step 6 of {n}')
    v.locator('.reach-search input').fill('')
    expect(v.locator('.reach-chip.reach-chip-match')).to_have_count(0)
    expect(v.locator('.reach-chip').nth(5)).to_have_class(re.compile('reach-chip-current'))
    v.locator('.reach-chip').nth(1).click()  # leave it on step 2 (three calls, Markdown, folds) for the screenshot


def drive_faulty(page, expect):
    "Safeguard chips and badges, the raw reply beside the parse, and the answer hidden until its step."
    v = page.locator('.t-faulty')
    answer = v.locator('.reach-answer')
    v.locator('.reach-chip').first.click()
    expect(answer).to_contain_text('hidden until its step')
    chip = v.locator('.reach-chip.reach-tone-ask').first
    chip.click()
    expect(v.locator('.reach-header')).to_contain_text(f"step {chip.inner_text().split(' ·')[0]} of")
    expect(v.locator('.reach-step-panel:visible .reach-safeguards .reach-badge').first).to_have_text('correction')
    expect(v.locator('.reach-step-panel:visible .reach-raw-reply .reach-label')).to_have_text(['raw reply', 'parsed'])
    # a repaired reply: open beside what was parsed, the repaired spots marked
    chip = v.locator('.reach-chip', has_text='parse repaired').first
    chip.click()
    expect(v.locator('.reach-header')).to_contain_text(f"step {chip.inner_text().split(' ·')[0]} of")
    expect(v.locator('.reach-step-panel:visible .reach-raw-reply')).to_have_attribute('open', '')
    raw = v.locator('.reach-step-panel:visible .reach-raw-reply .reach-columns > div').first
    if raw.locator('.reach-fold').count() and raw.locator('.reach-fold').get_attribute('open') is None:
        raw.locator('.reach-fold > summary').click()  # a long reply: the repair may be further down
    expect(raw.locator('mark.reach-repair:visible').first).to_be_visible()
    v.locator('.reach-last').click()
    expect(answer).to_contain_text('final answer')
    v.locator('.reach-chip', has_text='parse repaired').first.click()


def drive_dag(page, expect):
    "The plan with its dependencies and the timeline where independent calls overlap."
    v = page.locator('.t-dag')
    expect(v.locator('.reach-chip')).to_have_count(3)
    expect(v.locator('.reach-chip').first).to_contain_text('1 · plan')
    plan = v.locator('.reach-plan')
    if not plan.is_visible(): v.get_by_text('plan and timeline').click()
    expect(plan.locator('.reach-table tr')).to_have_count(4)
    expect(plan.locator('.reach-tl-row')).to_have_count(3)
    bars = {plan.locator('.reach-tl-row').nth(k).locator('.reach-tl-name').inner_text().split()[0]:
            plan.locator('.reach-tl-row').nth(k).locator('.reach-span').bounding_box() for k in range(3)}
    assert bars['refunds']['x'] < bars['orders']['x'] + bars['orders']['width'], f'orders and refunds should overlap: {bars}'
    assert bars['review']['x'] >= bars['orders']['x'] + bars['orders']['width'] - 2, f'review waits for orders: {bars}'


def live_step(page, expect, theme:str, width:int):
    "One live step from the browser: Step greys out, the status counts the seconds, the model's text streams in."
    v = page.locator('.t-live')
    status, step = v.locator('.reach-status'), v.locator('button.reach-step')
    n = v.locator('.reach-chip').count()
    expect(status).to_have_text('running')
    step.click()
    expect(step).to_be_disabled()
    expect(status).to_have_text(re.compile(r'calling the model… \d+ s'))
    expect(status).to_have_text(re.compile(r'calling the model… [1-9]\d* s'), timeout=5_000)  # the seconds go up
    page.wait_for_function("() => document.querySelector('.t-live .reach-stream').innerText.includes('the model is "
                           "writing')", polling=50, timeout=10_000)  # a second or so: watched closely
    shoot(page, theme, width, 'live', tag='_writing')
    expect(status).to_have_text('running', timeout=20_000)
    expect(v.locator('.reach-chip')).to_have_count(n + 1)
    expect(step).to_be_enabled()
    # the tools still had their dataset: no failed call
    assert v.locator('.reach-step-panel:visible .reach-actions .reach-badge').count() == 0, \
        v.locator('.reach-step-panel:visible .reach-actions').inner_text()[:500]


@pytest.mark.parametrize('theme,width', [('light', 1280), ('light', 800), ('dark', 1280), ('dark', 800)])
def test_every_control_in_each_theme_and_width(session, demo_run, theme, width):
    from playwright.sync_api import expect
    page, errors = session
    set_view(page, theme, width, height=1600)
    try:
        drive_demo(page, demo_run, expect)
        drive_faulty(page, expect)
        drive_dag(page, expect)
        live_step(page, expect, theme, width)
        where = f'{theme} theme at {width} px'
        assert_readable(page, '.t-demo', '.reach-simulated', f'simulated-run banner, {where}')
        assert_readable(page, '.t-demo', '.reach-chip', f'chips, {where}', at_least=len(demo_run.steps))
        assert_readable(page, '.t-faulty', '.reach-chip', f'chips with safeguards, {where}')
        assert_readable(page, '.t-faulty', '.reach-safeguards, .reach-header .reach-badge, .reach-totals',
                        f'safeguards, {where}', at_least=2)
        assert_readable(page, '.t-faulty', '.reach-raw-reply', f'raw reply with its repairs marked, {where}', at_least=3)
        assert_readable(page, '.t-demo', '.reach-step-panel, .reach-status, .reach-totals, .reach-answer, '
                        '.reach-matches, .reach-chart', f'body text, {where}', at_least=20)
        assert_readable(page, '.t-dag', '.reach-plan', f'plan and timeline, {where}', at_least=5)
    finally:
        shoot(page, theme, width, 'demo', 'faulty', 'dag', 'live')
    check_page(page, errors)


def test_stop_while_a_step_runs(session):
    "Stop pressed during a live step is acknowledged at once and takes effect when the step ends."
    from playwright.sync_api import expect
    page, errors = session
    set_view(page, 'light', 1280)
    v = page.locator('.t-live')
    status, step, stop = v.locator('.reach-status'), v.locator('button.reach-step'), v.locator('button.reach-stop')
    n = v.locator('.reach-chip').count()
    step.click()
    expect(status).to_have_text(re.compile('calling the model'))
    stop.click()
    expect(status).to_contain_text('Stop pressed: the run stops when this step ends')
    shoot(page, 'light', 1280, 'live', tag='_stopping')
    expect(status).to_have_text(re.compile(rf'finished: stopped \(you pressed Stop after step {n + 1};'), timeout=20_000)
    expect(step).to_be_disabled()
    expect(v.locator('.reach-totals')).to_contain_text('stop reason: stopped')
    shoot(page, 'light', 1280, 'live')
    check_page(page, errors)
