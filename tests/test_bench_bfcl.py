"""`reach bench bfcl` as a user runs it: offline on the committed replies of the local model, the errors a user can
make, and (marked live) a few entries asked of the real model, recorded and then replayed to the same table."""
import json
from pathlib import Path

import pytest

from reach_cli import clean_env, run_reach

HERE = Path(__file__).resolve().parent
SAMPLE = HERE/'bfcl'
SMALL = SAMPLE/'replies'/'qwen2.5-coder-0.5b'


def _rows(stdout:str) -> dict:
    "{(label, category): 'correct/n'} from the printed table."
    out = {}
    for line in stdout.splitlines():
        if line.startswith(('JSON, ', 'native, ')):
            label, rest = line[:34].strip(), line[34:].split()
            out[label, rest[0]] = rest[1]
    return out


# what the committed replies score, over the five categories: JSON mode on 10 entries each, native on 5
RECORDED = {('json', '10'): {'JSON, reach_nb parser + registry': '22/50', 'JSON, strict json.loads': '10/50'},
            ('json', '20'): {'JSON, reach_nb parser + registry': '45/100', 'JSON, strict json.loads': '20/100'},
            ('native', '5'): {'native, tool_calls only': '5/25', 'native, + calls in the text': '11/25'}}


@pytest.mark.parametrize('mode,limit', list(RECORDED))
def test_replayed_replies_give_the_recorded_figures(tmp_path, mode, limit):
    r = run_reach('bench', 'bfcl', '--replies', str(SMALL), '--data', str(SAMPLE), '--modes', mode, '--limit', limit,
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert len(rows) == 2 * 6  # two readers, five categories and all
    assert all(v.endswith(f'/{limit}') for k, v in rows.items() if k[1] != 'all')
    assert {k[0]: v for k, v in rows.items() if k[1] == 'all'} == RECORDED[mode, limit]
    assert 's per call' not in r.stdout  # nothing timed on a replay


def test_a_replay_that_lacks_a_cassette_is_one_error_line(tmp_path):
    r = run_reach('bench', 'bfcl', '--replies', str(tmp_path), '--data', str(SAMPLE), cwd=tmp_path)
    assert (r.returncode, r.stdout.count('\n'), r.stderr) == (
        2, 2, f"Error: no recorded replies json-simple_python.jsonl in {tmp_path}: record them with --model "
              "local:NAME --record DIR\n")


def test_no_network_is_one_error_line(tmp_path):
    env = clean_env(REACH_DATA_DIR=str(tmp_path/'data'), PIP_INDEX_URL='http://127.0.0.1:9/simple',
                    PIP_EXTRA_INDEX_URL='', PIP_FIND_LINKS='', PIP_RETRIES='0', PIP_TIMEOUT='1')
    r = run_reach('bench', 'bfcl', '--replies', str(SMALL), cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stdout == '' and r.stderr.count('\n') == 1, r.stderr
    assert r.stderr.startswith('Error: pip could not download the wheel (') and ' in bfcl-eval==2026.3.23: ' in r.stderr
    assert not (tmp_path/'data'/'bfcl').exists()


@pytest.mark.live
def test_the_local_model_live_then_replayed(tmp_path):
    args = ['--data', str(SAMPLE), '--limit', '2', '--modes', 'json,native', '--categories', 'simple_python,irrelevance']
    live = run_reach('bench', 'bfcl', '--model', 'local:qwen2.5-coder-0.5b', '--record', str(tmp_path), *args,
                     cwd=tmp_path, timeout=1200)
    assert live.returncode == 0, live.stderr
    assert '8 model calls, ' in live.stdout and ' s per call' in live.stdout
    seconds = json.loads((tmp_path/'seconds.json').read_text())
    assert sorted(seconds) == ['json-irrelevance', 'json-simple_python', 'native-irrelevance', 'native-simple_python']
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in seconds.values())
    replay = run_reach('bench', 'bfcl', '--replies', str(tmp_path), *args, cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert _rows(replay.stdout) == _rows(live.stdout) and len(_rows(live.stdout)) == 4 * 3
