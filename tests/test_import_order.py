"""A class behaves the same whichever modules were imported: each check runs in a fresh interpreter that imports
only the module defining the class, and uses a method whose machinery lives in a later module."""
import subprocess, sys, textwrap

import pytest

CASES = {
    'Run.prompt_at': '''
        from reach_nb.core import Run
        from reach_nb.llm.models import ScriptedLLM
        from reach_nb.agents.react import ReActAgent
        run = ReActAgent(ScriptedLLM(['{"thought": "t", "answer": "a"}']), []).run('q')
        assert run.prompt_at(1)[-1] == {'role': 'user', 'content': 'q'}, run.prompt_at(1)''',
    'ReActAgent.chat': '''
        from reach_nb.llm.models import ScriptedLLM
        from reach_nb.agents.react import ReActAgent
        agent = ReActAgent(ScriptedLLM(['{"thought": "t", "answer": "one"}', '{"thought": "t", "answer": "two"}']), [])
        assert [agent.chat(m).answer for m in ('first', 'second')] == ['one', 'two']
        assert len(agent.sessions['default'].runs) == 2''',
    'RunViewer.to_html': '''
        import sys, tempfile
        from pathlib import Path
        from reach_nb.llm.models import ScriptedLLM
        from reach_nb.agents.react import ReActAgent
        from reach_nb.viewer.widget import RunViewer
        run = ReActAgent(ScriptedLLM(['{"thought": "t", "answer": "a"}']), []).run('q')
        v = RunViewer(run)
        page = v.to_html(Path(tempfile.mkdtemp())/'run.html').read_text(encoding='utf-8')
        assert page.startswith('<!doctype html>') and 'q' in page
''',
}


@pytest.mark.parametrize('name', CASES)
def test_methods_do_not_depend_on_what_was_imported(name):
    code = textwrap.dedent(CASES[name])
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def test_run_viewer_shows_static_html_without_share_imported():
    "The viewer's display bundle has the whole run as HTML though `reach_nb.viewer.share` was not imported; it loads then."
    code = textwrap.dedent('''
        import sys
        from reach_nb.llm.models import ScriptedLLM
        from reach_nb.agents.react import ReActAgent
        from reach_nb.viewer.widget import RunViewer
        run = ReActAgent(ScriptedLLM(['{"thought": "t", "answer": "the answer"}']), []).run('the question')
        v = RunViewer(run)
        assert 'reach_nb.viewer.share' not in sys.modules
        b = v._repr_mimebundle_()
        assert 'reach_nb.viewer.share' in sys.modules
        from reach_nb.viewer.share import run_static_html
        assert sorted(b) == ['application/vnd.jupyter.widget-view+json', 'text/html', 'text/plain'], sorted(b)
        assert b['text/html'] == run_static_html(run) and 'the answer' in b['text/html']''')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def run_fresh(code:str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_evaluating_a_model_does_not_load_the_simulator():
    "The evaluation, the registry and the risk agents import the simulated analyst only when it is the model."
    r = run_fresh('''
        import sys
        import reach_nb.eval, reach_nb.risk.agents, reach_nb.agents.registry
        from reach_nb.llm.models import get_model
        from reach_nb.risk.agents import risk_agent
        with risk_agent(llm=get_model('echo')) as a: pass
        assert 'reach_nb.risk.analyst' not in sys.modules, 'loaded without being the model'
        assert type(get_model('sim-analyst')).__name__ == 'SimAnalyst'
        assert 'reach_nb.risk.analyst' in sys.modules''')
    assert r.returncode == 0, r.stderr[-3000:]
