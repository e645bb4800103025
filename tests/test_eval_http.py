"""`eval_cli` against the local OpenAI-compatible endpoint over real HTTP, with the real `openai` client: the server
plays the simulated analyst, the agent reaches it as `openai:sim-analyst`. The runs are graded, labelled simulated
(the server says so in a header), and tasks the analyst cannot simulate are never counted as passed."""
import re

from reach_nb.eval import NOT_SIMULATED, Results, eval_cli
from reach_nb.modelserver import ModelServer
from reach_nb.sim_analyst import SimAnalyst


def _eval(out, **kw):
    lines = []
    with ModelServer(SimAnalyst()) as srv:
        code = eval_cli(models=['openai:sim-analyst'], base_url=srv.base_url, out=out, progress=False,
                        echo=lines.append, concurrency=2, **kw)
    with Results(out/'results.duckdb') as res: rows = res.rows()
    return code, '\n'.join(lines), rows


def test_demo_tasks_pass_over_http(tmp_path):
    code, text, rows = _eval(tmp_path, tags=['demo'])
    assert code == 0
    assert len(rows) == 5 and {r['status'] for r in rows} == {'passed'}
    assert all(r['model'] == 'openai:sim-analyst' and r['simulated'] for r in rows)
    assert all(r['model_calls'] >= 7 and r['total_tokens'] > 0 for r in rows)
    assert re.search(r'react · openai:sim-analyst +3 +5 +100% \(57%-100%\)', text), text
    assert (tmp_path/rows[0]['trace']).exists()


def test_questions_it_cannot_simulate_are_not_passed(tmp_path):
    code, text, rows = _eval(tmp_path, levels=[1])
    said = [r for r in rows if NOT_SIMULATED.search(r['answer'])]
    assert code == 0 and len(rows) >= 15 and len(said) >= 15
    assert {r['status'] for r in said} == {'not_simulated'}
    assert not any(r['passed'] for r in rows)  # the others answered another question: failed, not passed
    assert re.search(rf'react · openai:sim-analyst +1 +{len(rows)} +0% \(0%-\d+%\) +{len(said)} ', text), text
