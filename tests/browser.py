"""Helpers for the browser tests: Debian's Chromium (installed on demand) and a headless JupyterLab on localhost.

Playwright's own browser download does not work here, so Playwright (the Python package from the dev extras,
whose wheel carries its driver) drives Debian's `/usr/bin/chromium` through `executable_path`.
"""
import importlib, importlib.util, json, os, signal, socket, subprocess, sys, time
from contextlib import contextmanager
from pathlib import Path

import httpx

CHROMIUM = Path('/usr/bin/chromium')
# Without the networking flags Chromium's background connections are refused by this closed network;
# as root it needs --no-sandbox.
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']
TOKEN = 'reach-browser-test'


def _run(cmd:list[str], timeout:int, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _apt_install(pkg:str):
    "Install a Debian package non-interactively, or raise saying what failed."
    if os.geteuid() != 0: raise RuntimeError(f'{pkg} is missing and only root can install it: run `apt-get install -y {pkg}` as root.')
    env = os.environ | {'DEBIAN_FRONTEND': 'noninteractive'}
    for cmd in (['apt-get', 'update'], ['apt-get', 'install', '-y', '--no-install-recommends', pkg]):
        r = _run(cmd, timeout=900, env=env)
        if r.returncode: raise RuntimeError(f'`{" ".join(cmd)}` failed ({r.returncode}); install {pkg} by hand.\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}')


def ensure_chromium() -> Path:
    "Debian's Chromium at /usr/bin/chromium, installing `chromium` (and a CJK font, `fonts-noto-cjk`) if missing."
    if not CHROMIUM.exists(): _apt_install('chromium')
    if not CHROMIUM.exists(): raise RuntimeError(f'`apt-get install chromium` ran but {CHROMIUM} is still missing.')
    if not _run(['fc-list', ':lang=zh'], timeout=60).stdout.strip(): _apt_install('fonts-noto-cjk')  # 充值, not boxes
    version = _run([str(CHROMIUM), '--version'], timeout=60).stdout.strip()
    if not (version.startswith('Chromium') and 'Debian' in version): raise RuntimeError(f'{CHROMIUM} is not Debian\'s Chromium: `--version` printed {version!r}.')
    return CHROMIUM


def ensure_python_package(module:str, # the module to import
                          requirement:str, # what pip installs when it is missing
                         ):
    "Import `module`, pip-installing `requirement` first if it is missing (both belong in the dev extras)."
    if importlib.util.find_spec(module.split('.')[0]) is None:
        r = _run([sys.executable, '-m', 'pip', 'install', '-q', requirement], timeout=900)
        if r.returncode: raise RuntimeError(f'`pip install {requirement}` failed; add it to the dev extras.\n{r.stderr[-2000:]}')
        importlib.invalidate_caches()
    return importlib.import_module(module)


def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


def write_notebook(path:Path, *sources:str) -> Path:
    "A notebook of code cells with the given sources, for the current Python's kernel."
    cells = [{'cell_type': 'code', 'execution_count': None, 'id': f'cell{i}', 'metadata': {}, 'outputs': [], 'source': s}
             for i, s in enumerate(sources)]
    meta = {'kernelspec': {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}, 'language_info': {'name': 'python'}}
    path.write_text(json.dumps({'cells': cells, 'metadata': meta, 'nbformat': 4, 'nbformat_minor': 5}), encoding='utf-8')
    return path


def write_lab_settings(settings_dir:Path, # JupyterLab's user settings folder (JUPYTERLAB_SETTINGS_DIR)
                       settings:dict[str, dict]): # by plugin id, e.g. {'@jupyterlab/apputils-extension:themes': {...}}
    "Write JupyterLab user settings, one `<package>/<plugin>.jupyterlab-settings` file per plugin."
    for plugin, values in settings.items():
        package, name = plugin.split(':')
        f = Path(settings_dir)/package/f'{name}.jupyterlab-settings'
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))


def _lab_env(home:Path, settings:dict[str, dict]|None=None, **extra) -> dict:
    "The environment for JupyterLab: the user's Jupyter/IPython config hidden, the environment's lab extensions kept."
    dirs = {'JUPYTER_CONFIG_DIR': home/'config', 'JUPYTER_DATA_DIR': home/'data', 'JUPYTER_RUNTIME_DIR': home/'runtime',
            'IPYTHONDIR': home/'ipython', 'JUPYTERLAB_SETTINGS_DIR': home/'settings', 'JUPYTERLAB_WORKSPACES_DIR': home/'workspaces'}
    for d in dirs.values(): d.mkdir(parents=True, exist_ok=True)
    # no "fetch news?" toast over the page
    write_lab_settings(home/'settings', {'@jupyterlab/apputils-extension:notification':
                                         {'fetchNews': 'false', 'checkForUpdates': False}} | (settings or {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(('JUPYTER', 'IPYTHON'))}
    return env | {k: str(v) for k, v in dirs.items()} | {'PYTHONUNBUFFERED': '1'} | extra


def _wait_ready(proc:subprocess.Popen, url:str, log:Path, timeout:float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None: raise RuntimeError(f'JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}')
        try:
            if httpx.get(url, timeout=2).status_code == 200: return
        except httpx.HTTPError: pass
        time.sleep(0.3)
    raise TimeoutError(f'JupyterLab did not answer {url} within {timeout}s:\n{log.read_text()[-3000:]}')


def _stop(proc:subprocess.Popen):
    "End the server and its kernels (its whole process group)."
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try: proc.wait(10)
        except subprocess.TimeoutExpired: os.killpg(proc.pid, signal.SIGKILL); proc.wait(10)
    try: os.killpg(proc.pid, signal.SIGKILL)  # kernels left behind in the group
    except ProcessLookupError: pass


@contextmanager
def jupyterlab(root:Path, # the folder JupyterLab serves
               home:Path, # a scratch folder for its config, runtime files and log
               timeout:float=60, # seconds to wait for the server to answer
               settings:dict[str, dict]|None=None, # JupyterLab user settings by plugin id (see `write_lab_settings`)
               **env):
    "A headless JupyterLab on a free localhost port; yields its base URL (the token is `TOKEN`)."
    ensure_python_package('jupyterlab', 'jupyterlab>=4')
    port, log = free_port(), home/'jupyterlab.log'
    cmd = [sys.executable, '-m', 'jupyterlab', '--no-browser', '--allow-root', f'--port={port}', '--ip=127.0.0.1',
           f'--IdentityProvider.token={TOKEN}', f'--ServerApp.root_dir={root}', '--ServerApp.open_browser=False',
           '--LabApp.news_url=None', '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate',
           '--LabApp.extension_manager=readonly', '--LabApp.expose_app_in_browser=True', '--ServerApp.port_retries=0']
    with open(log, 'w') as out:
        proc = subprocess.Popen(cmd, cwd=root, env=_lab_env(home, settings, **env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f'http://127.0.0.1:{port}'
    try:
        _wait_ready(proc, f'{base}/api/status?token={TOKEN}', log, timeout)
        yield base
    finally: _stop(proc)


# The contrast of every visible text, from the computed styles (WCAG 2 relative luminance), for the page tests.
CONTRAST = r"""root => {
  const parse = c => {
    let m = /^rgba?\(([^)]*)\)$/.exec(c);
    if (m) { const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; }
    m = /^color\(srgb ([^)]*)\)$/.exec(c);
    if (m) { const p = m[1].split(/[\s\/]+/).filter(Boolean).map(Number); return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1]; }
    return null;
  };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const canvas = () => matchMedia('(prefers-color-scheme: dark)').matches ? [18, 18, 18, 1] : [255, 255, 255, 1];
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c === null) return null;
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reduceRight((under, top) => over(top, under), canvas());
  };
  const lum = c => c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
                                .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  const out = [], seen = new Set(), walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const el = walk.currentNode.parentElement;
    if (!walk.currentNode.textContent.trim() || seen.has(el)) continue;
    seen.add(el);
    if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height) continue;
    const cs = getComputedStyle(el), bg = background(el), fg = parse(cs.color);
    const what = {text: walk.currentNode.textContent.trim().slice(0, 50), tag: el.tagName, cls: String(el.className),
                  color: cs.color, background: bg && `rgb(${bg.slice(0, 3).map(Math.round)})`};
    if (!bg || !fg) { out.push({...what, ratio: 0}); continue; }
    const [a, b] = [lum(over(fg, bg)), lum(bg)].sort((x, y) => y - x);
    out.push({...what, ratio: (a + 0.05) / (b + 0.05)});
  }
  return out;
}"""


def low_contrast(page, root_selector:str='body') -> tuple[int, list[dict]]:
    "How many visible texts were checked, and those with a contrast below 4.5:1 (worst first)."
    found = page.locator(root_selector).first.evaluate(CONTRAST)
    bad = sorted((t for t in found if t['ratio'] < 4.5), key=lambda t: t['ratio'])
    return len(found), bad


def open_page(browser, url:str, scheme:str='light', width:int=1280):
    "A fresh page at `url` in `scheme`; its console errors and page errors are collected in `page.errors`."
    ctx = browser.new_context(viewport={'width': width, 'height': 900}, color_scheme=scheme)
    page = ctx.new_page()
    page.errors = []
    page.on('console', lambda m: m.type == 'error' and page.errors.append(m.text))
    page.on('pageerror', lambda e: page.errors.append(str(e)))
    page.on('dialog', lambda d: (page.errors.append(f'dialog: {d.message}'), d.dismiss()))
    page.goto(url)
    return page
