"""`eval_cli` against the local OpenAI-compatible endpoint over real HTTP, with the real `openai` client: the server
plays the simulated analyst, the agent reaches it as `openai:sim-analyst`. The runs are graded, labelled simulated
(the server says so in a header), and tasks the analyst cannot simulate are never counted as passed."""
import json, re

from reach_nb.eval import NOT_SIMULATED, Results, eval_cli, load_tasks
from reach_nb.llm.server import ModelServer
from reach_nb.risk.analyst import SimAnalyst


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


DECLINED = ['l3-refund-game-channel', 'l3-doubled-channel-payers', 'l3-farm-game-channels',
            'l3-discount-channel-game-zh', 'l3-usd-channel-payers']  # kinds of question the analyst does not play


def test_questions_it_cannot_simulate_are_not_passed(tmp_path):
    mine = tmp_path/'declined.jsonl'
    mine.write_text(''.join(json.dumps(t.model_dump(exclude_none=True, exclude={'source'}), ensure_ascii=False) + '\n'
                            for t in load_tasks(ids=DECLINED)), encoding='utf-8')
    code, text, rows = _eval(tmp_path/'out', tasks=[mine])
    assert code == 0 and sorted(r['task_id'] for r in rows) == sorted(DECLINED)
    assert all(NOT_SIMULATED.search(r['answer']) for r in rows)
    assert {r['status'] for r in rows} == {'not_simulated'} and not any(r['passed'] for r in rows)
    assert re.search(r'react · openai:sim-analyst +3 +5 +0% \(0%-\d+%\) +5 ', text), text
