"""Task files a user writes: a bad one stops `eval_cli` before anything runs, with one line naming the file, the task
and what is wrong; a good one of their own runs beside the shipped ones."""
import json

import pytest

from reach_nb.core import UserError
from reach_nb.eval import Results, eval_cli, load_tasks

GOOD = dict(id='mine-games', level=1, lang='en', question='How many games are there?', steps=1,
            truth={'sql': 'SELECT count(*) FROM games'}, grader={'kind': 'numeric', 'abs': 0})


def _fails(tmp_path, text:str, name:str='mine.jsonl') -> str:
    (tmp_path/name).write_text(text, encoding='utf-8')
    with pytest.raises(UserError) as e:
        eval_cli(tasks=[tmp_path/name], out=tmp_path/'out', progress=False, echo=lambda *a: None)
    assert not (tmp_path/'out'/'results.duckdb').exists()  # nothing ran
    msg = str(e.value)
    assert '\n' not in msg
    return msg


def test_a_task_that_breaks_the_schema(tmp_path):
    msg = _fails(tmp_path, json.dumps(GOOD | {'grader': {'kind': 'numeric', 'tolerance': 0.1}}) + '\n')
    assert msg == (f"task 'mine-games': grader: Additional properties are not allowed ('tolerance' was unexpected) "
                   f"in {tmp_path/'mine.jsonl'}:1: fix it as data/eval/task.schema.json describes "
                   "(data/eval/README.md has examples)")


def test_a_line_that_is_not_json(tmp_path):
    msg = _fails(tmp_path, json.dumps(GOOD) + '\n{"id": "x", \n')
    assert msg.startswith('not a JSON object') and f"in {tmp_path/'mine.jsonl'}:2:" in msg


def test_yaml_syntax_and_a_missing_key(tmp_path):
    msg = _fails(tmp_path, 'tasks:\n  - id: y\n    question: "unclosed\n', 'mine.yaml')
    assert msg.startswith('not valid YAML') and str(tmp_path/'mine.yaml') in msg
    msg = _fails(tmp_path, 'tasks:\n  - {id: y, level: 1, lang: en, steps: 1, truth: {sql: SELECT 1}, '
                           'grader: {kind: exact}}\n', 'mine.yaml')
    assert msg.startswith("task 'y': 'question' is a required property in ")


def test_a_truth_that_fails_on_the_data(tmp_path):
    msg = _fails(tmp_path, json.dumps(GOOD | {'truth': {'sql': 'SELECT count(*) FROM gamez'}}) + '\n')
    assert msg.startswith("task 'mine-games': its truth failed (CatalogException: Catalog Error: Table with name gamez")
    msg = _fails(tmp_path, json.dumps(GOOD | {'truth': {'python': 'reach_nb.eval:no_such_function'}}) + '\n')
    assert msg.startswith("task 'mine-games': truth.python 'reach_nb.eval:no_such_function' is not a truth function")


def test_an_id_used_twice(tmp_path):
    shipped = load_tasks()[0].id
    (tmp_path/'mine.jsonl').write_text(json.dumps(GOOD | {'id': shipped}) + '\n')
    with pytest.raises(UserError, match=f"task id '{shipped}' is used twice"):
        load_tasks([tmp_path/'mine.jsonl', *[t.source for t in load_tasks()[:1]]])


def test_a_task_of_ones_own_runs(tmp_path):
    (tmp_path/'mine.jsonl').write_text(json.dumps(GOOD) + '\n')
    lines = []
    assert eval_cli(tasks=[tmp_path/'mine.jsonl'], out=tmp_path/'out', progress=False, echo=lines.append) == 0
    with Results(tmp_path/'out'/'results.duckdb') as res: [row] = res.rows()
    assert (row['task_id'], row['status'], row['passed']) == ('mine-games', 'passed', True)
    assert lines[0].startswith('1 task · 1 configuration · 1 seed')


def test_truth_sql_cannot_write_or_read_files(tmp_path):
    pth = tmp_path/'site'/'owned.pth'
    pth.parent.mkdir()
    for sql in (f"COPY (SELECT 'import os; os.system(\"touch {tmp_path}/ran\")' AS x) TO '{pth}' (HEADER false)",
                "SELECT content FROM read_text('/etc/shadow')", "SELECT * FROM read_csv('/etc/passwd')",
                f"ATTACH '{tmp_path}/other.duckdb' AS o", "INSTALL httpfs", "SET enable_external_access = true"):
        msg = _fails(tmp_path, json.dumps(GOOD | {'truth': {'sql': sql}}) + '\n')
        assert msg.startswith("task 'mine-games': its truth failed (") and 'Exception' in msg, msg
    assert list(tmp_path.iterdir()) == [tmp_path/'mine.jsonl', tmp_path/'site'] and not any(pth.parent.iterdir())


@pytest.mark.parametrize('fn', ['shutil:copy', 'os:remove', 'builtins:exec', 'reach_nb.eval:compute_truth'])
def test_only_registered_truth_functions_run(tmp_path, fn):
    target = tmp_path/'keep.txt'
    target.write_text('still here')
    msg = _fails(tmp_path, json.dumps(GOOD | {'truth': {'python': fn, 'args': {'path': str(target)}}}) + '\n')
    assert msg.startswith(f"task 'mine-games': truth.python '{fn}' is not a truth function") and target.exists()


def test_a_truth_with_too_many_rows_is_refused(tmp_path):
    msg = _fails(tmp_path, json.dumps(GOOD | {'truth': {'sql': 'SELECT x FROM range(50_000_000) t(x)'}}) + '\n')
    assert 'its truth failed (ValueError: the query returns more than 10,000 rows)' in msg


def test_task_files_that_would_exhaust_memory_or_the_stack(tmp_path):
    bomb = 'a: &a [x, x, x, x, x, x, x, x, x, x]\n' + ''.join(
        f'{chr(98 + i)}: &{chr(98 + i)} [' + ', '.join([f'*{chr(97 + i)}'] * 10) + ']\n' for i in range(8))
    assert _fails(tmp_path, bomb + 'tasks: [*i]\n', 'mine.yaml').startswith('the YAML expands to more than')
    deep = 'tasks: ' + '[' * 100_000 + ']' * 100_000 + '\n'
    assert _fails(tmp_path, deep, 'mine.yaml').startswith('the YAML nests deeper than 64 levels')
    args = json.dumps(GOOD | {'truth': {'python': 'reach_nb.eval:incident_rows', 'args': {'patterns': [0]}}})
    deep_json = args.replace('[0]', '[' * 50_000 + ']' * 50_000)
    assert _fails(tmp_path, deep_json + '\n').startswith('the JSON nests deeper than 64 levels')
