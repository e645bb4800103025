"A user's mistake, through the real `reach` script: one `Error:` line on stderr naming where, exit 2, no traceback."
import json, socket, subprocess
import pytest
from reach_cli import REACH, clean_env, run_reach


def _one_error_line(r, *parts):
    "Assert `r` failed as a user's mistake: exit 2, exactly one stderr line starting `Error:` and holding `parts`."
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('Error: '), r.stderr
    assert 'Traceback' not in r.stdout + r.stderr
    for p in parts: assert p in lines[0], (p, lines[0])
    return lines[0]


@pytest.fixture
def script(tmp_path):
    "A scripted model that answers at once."
    p = tmp_path/'script.json'
    p.write_text(json.dumps([json.dumps({'thought': 'Known.', 'answer': 'Forty-two.'})]))
    return f'scripted:{p}'


@pytest.mark.parametrize('value', ['abc', '0', '-3'])
def test_bad_setting_in_the_environment_names_the_variable(tmp_path, script, value):
    r = run_reach('ask', '--model', script, 'Why?', cwd=tmp_path, env=clean_env(REACH_MAX_STEPS=value))
    _one_error_line(r, 'max_steps', f"got '{value}' in REACH_MAX_STEPS: ")


@pytest.mark.parametrize('value', ['lots', '100', '10KB', '120%'])
def test_bad_memory_limit_is_named_before_duckdb_sees_it(tmp_path, value):
    "DuckDB would stop the first query with its parser's traceback; the setting is checked on loading."
    r = run_reach('demo', cwd=tmp_path, env=clean_env(REACH_DUCKDB_MEMORY_LIMIT=value))
    _one_error_line(r, 'duckdb_memory_limit must be auto', f"got '{value}' in REACH_DUCKDB_MEMORY_LIMIT: ")


def test_bad_memory_limit_option_of_bench_data(tmp_path):
    r = run_reach('bench', 'data', '--rows', '1000', '--memory-limit', '5MB', cwd=tmp_path)
    _one_error_line(r, "got '5MB' in option --memory-limit: give e.g. auto, 2GB")


@pytest.mark.parametrize('text, line, what', [
    ('[reach]\nmodel = echo\nmax_steps = many\n', 3, "max_steps must be a whole number of at least 1, got 'many'"),
    ('model = echo\n[reach]\n', 1, "setting 'model' outside a section"),
    ('[reach]\nmodel echo\n', 2, "broken line 'model echo'"),
    ('[reach]\n# a comment\nmodle = echo\n', 3, "unknown setting 'modle'"),
    ('[reach]\nrequest_timeout = 0\n', 2, 'request_timeout must be a number above 0'),
])
def test_bad_settings_file_names_file_and_line(tmp_path, script, text, line, what):
    (tmp_path/'settings.ini').write_text(text)
    r = run_reach('ask', '--model', script, 'Why?', cwd=tmp_path)
    err = _one_error_line(r, what, f"settings.ini:{line}: ")
    if 'unknown' in what: assert 'use one of model, base_url' in err and 'request_timeout' in err


@pytest.mark.parametrize('args, parts', [
    (['ask', 'Why?', '--max-steps', '0'], ['got 0 in option --max-steps']),
    (['ask', 'Why?', '--max-steps', '-2'], ['got -2 in option --max-steps']),
    (['ask', 'Why?', '--timeout', '0'], ['request_timeout must be a number above 0', 'option --timeout']),
    (['ask', 'Why?', '--model', 'openai:x', '--base-url', 'notaurl'],
     ["base_url must be an http:// or https:// address, got 'notaurl' in option --base-url"]),
    (['ask', ''], ['the question is empty in the QUESTION argument']),
    (['ask', '   '], ['the question is empty']),
    (['ask'], ['no question in reach ask', '--file']),
    (['ask', '--file', 'nosuch.txt'], ['no file nosuch.txt in option --file']),
    (['demo', ''], ['the question is empty']),
    (['data', 'build', '--rows', '-5'], ['--rows must be at least 1, got -5 in option --rows']),
    (['data', 'build', '--rows', 'many'], ["Invalid value for '--rows'", 'reach data build --help']),
    (['serve-model', '--errors', 'abc'], ["bad HTTP statuses 'abc' in option --errors", '429,500']),
    (['serve-model', '--latency', '-1'], ['--latency must be at least 0']),
    (['serve-model', '--wire', 'nosuch'], ["unknown wire format 'nosuch' in option --wire", 'hermes']),
    (['ask', '--no-such-option', 'Why?'], ['No such option', 'reach ask --help']),
    (['eval', '--out', '/proc/nope'], ['cannot make the folder /proc/nope (', 'in option --out']),
    (['bench', 'loop', '--steps', '0'], ['--steps must be at least 1, got 0 in option --steps']),
    (['bench', 'loop', '--runs', '0'], ['--runs must be at least 1, got 0 in option --runs']),
    (['bench', 'loop', '--rounds', '0'], ['--rounds must be at least 1, got 0 in option --rounds']),
    (['serve-model', '--port', '99999'], ['--port must be from 0 to 65535, got 99999 in option --port']),
    (['runs', '--limit', '0'], ['--limit must be at least 1, got 0 in option --limit']),
    (['show', 'nosuch'], ["no run 'nosuch' in the RUN_ID argument: reach runs lists them"]),
])
def test_bad_options_give_one_error_line(tmp_path, script, args, parts):
    if args[0] == 'ask' and len(args) > 1: args = [*args, '--model', script]
    _one_error_line(run_reach(*args, cwd=tmp_path), *parts)


def test_unknown_model_spec_for_serve_model_lists_the_known_ones(tmp_path):
    "Not 'no endpoint is configured': the spec is unknown, and these are the ones there are."
    err = _one_error_line(run_reach('serve-model', '--model', 'nosuch', cwd=tmp_path), "unknown model spec 'nosuch' in option --model")
    assert 'endpoint' not in err
    for known in ['echo', 'scripted:', 'replay:', 'sim-analyst']: assert known in err


def test_unreadable_model_spec_file(tmp_path):
    _one_error_line(run_reach('ask', '--model', f'scripted:{tmp_path}/none.json', 'Why?', cwd=tmp_path),
                    "cannot use the model 'scripted:", 'option --model')


def test_no_model_configured_says_what_to_set(tmp_path):
    _one_error_line(run_reach('ask', 'hello', cwd=tmp_path, env=clean_env(REACH_MODEL='gpt-4o')),
                    "cannot use the model 'gpt-4o': no model endpoint is configured in the model setting", 'REACH_API_KEY')


def test_trace_path_that_cannot_be_written(tmp_path, script):
    (tmp_path/'afile').write_text('x')
    r = run_reach('ask', '--model', script, '--trace', str(tmp_path), 'Why?', cwd=tmp_path)
    _one_error_line(r, 'is a folder in option --trace')
    r = run_reach('ask', '--model', script, '--trace', str(tmp_path/'afile'/'run.jsonl'), 'Why?', cwd=tmp_path)
    _one_error_line(r, 'cannot write the trace', 'in option --trace')
    r = run_reach('ask', '--model', script, '--trace', '/proc/reach-no-such-dir/run.jsonl', 'Why?', cwd=tmp_path)
    _one_error_line(r, 'cannot write the trace', 'in option --trace')
    (tmp_path/'settings.ini').write_text(f'[reach]\ntrace_dir = {tmp_path/"afile"}\n')
    _one_error_line(run_reach('demo', cwd=tmp_path), 'cannot write the trace', 'in the trace_dir setting')


def test_debug_shows_the_traceback_too(tmp_path):
    r = run_reach('--debug', 'ask', '', cwd=tmp_path)
    assert r.returncode == 2 and 'Traceback' in r.stderr and 'UserError' in r.stderr
    assert r.stderr.splitlines()[-1].startswith('Error: the question is empty')



@pytest.mark.parametrize('args', [[], ['data'], ['bench']])
def test_no_arguments_shows_the_help_once(tmp_path, args):
    r = run_reach(*args, cwd=tmp_path)
    assert r.returncode == 0 and (r.stdout + r.stderr).count('Usage:') == 1, r.stdout + r.stderr


def test_serve_model_on_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0)); taken.listen()
        port = taken.getsockname()[1]
        r = run_reach('serve-model', '--port', str(port), cwd=tmp_path, timeout=30)
    _one_error_line(r, f'cannot listen on 127.0.0.1:{port} (Address already in use) in option --port: '
                       'give another port, or stop what listens on it')


@pytest.mark.parametrize('model', [[], ['--model', 'sim-analyst']])
def test_native_with_the_offline_analyst_is_refused_up_front(tmp_path, model):
    r = run_reach('ask', *model, '--native', '--trace', str(tmp_path/'t.jsonl'), 'Why?', cwd=tmp_path)
    _one_error_line(r, 'plays the JSON protocol only in option --native: drop --native')
    assert not list(tmp_path.glob('t*.jsonl'))  # refused before the run began


def test_a_question_that_is_not_utf8_is_refused_from_a_file_and_from_stdin(tmp_path, script):
    latin1 = 'Pourquoi le pic de février ?'.encode('latin-1')
    (tmp_path/'q.txt').write_bytes(latin1)
    _one_error_line(run_reach('ask', '--model', script, '--file', 'q.txt', cwd=tmp_path),
                    'q.txt is not UTF-8 text (byte 20) in option --file')
    r = subprocess.run([REACH, 'ask', '--model', script, '-'], input=latin1, cwd=tmp_path, env=clean_env(),
                       capture_output=True, timeout=120)
    r.stdout, r.stderr = r.stdout.decode(), r.stderr.decode()
    _one_error_line(r, 'the question is not UTF-8 text (byte 20) in standard input')


def test_data_build_never_replaces_a_file_that_is_not_a_dataset(tmp_path):
    import duckdb
    (tmp_path/'notes.txt').write_text('my notes')
    with duckdb.connect(str(tmp_path/'mine.duckdb')) as con: con.execute('CREATE TABLE t AS SELECT 42 AS x')
    for name, why in (('notes.txt', 'not a valid DuckDB database'), ('mine.duckdb', 'without a dataset_meta table')):
        before = (tmp_path/name).read_bytes()
        for force in ([], ['--force']):
            r = run_reach('data', 'build', '--rows', '20000', '--path', name, *force, cwd=tmp_path)
            _one_error_line(r, f'{tmp_path/name} is not a reach dataset (', why, 'in option --path')
            assert (tmp_path/name).read_bytes() == before
    _one_error_line(run_reach('data', 'build', '--rows', '20000', '--path', str(tmp_path), cwd=tmp_path),
                    'is a folder in option --path')
