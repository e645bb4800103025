"""Traces on disk as a crash leaves them: cut at any byte, not text, a bad line in the middle; and traces of real runs
whose model sends what JSON can't hold as it is."""
import json, multiprocessing, os, warnings
import pytest
from reach_nb.core import Run, UserError, TraceWriter, read_trace
from reach_nb.llm.models import ScriptedLLM
from reach_nb.agents.react import ReActAgent


def lookup(key: str) -> str:
    "Look a key up."
    return f'value of {key}'


def _real_trace(tmp_path, replies):
    "The trace of a real ReAct run over a scripted model, written as it goes."
    path = tmp_path/'run.jsonl'
    with TraceWriter(path) as w:
        for e in ReActAgent(ScriptedLLM(replies), [lookup]).stream('What is 代充?'): w.write(e)
    return path


REPLIES = [json.dumps({'thought': '先查 \ud800', 'action': {'tool': 'lookup', 'args': {'key': '代充 \udfff'}}}, ensure_ascii=False),
           json.dumps({'thought': 'Done.', 'answer': 'It is proxy recharging 代充.'}, ensure_ascii=False)]


def test_real_run_with_lone_surrogates_saves_and_loads(tmp_path):
    run = Run.load(_real_trace(tmp_path, REPLIES))
    assert run.status == 'finished' and run.answer == 'It is proxy recharging 代充.'
    assert run.steps[0].thought == '先查 \ufffd' and run.steps[0].actions[0].args == {'key': '代充 \ufffd'}
    assert run.steps[0].observation == 'value of 代充 \ufffd'


BREAKS = '\u2028 \u2029 \x85'


@pytest.mark.parametrize('where', ['thought', 'args', 'answer', 'raw'])
def test_line_separators_a_model_writes_read_back(tmp_path, where):
    thought, key, answer = (f'look {BREAKS} up' if where == w else w for w in ('thought', 'args', 'answer'))
    first = json.dumps({'thought': thought, 'action': {'tool': 'lookup', 'args': {'key': key}}}, ensure_ascii=False)
    if where == 'raw': first = f'Sure{BREAKS}\n' + first
    run = Run.load(_real_trace(tmp_path, [first, json.dumps({'thought': 'ok', 'answer': answer}, ensure_ascii=False)]))
    assert run.status == 'finished' and len(run.steps) == 2
    got = {'thought': run.steps[0].thought, 'args': run.steps[0].actions[0].args['key'], 'answer': run.answer,
           'raw': run.steps[0].raw}
    assert BREAKS in got[where]


def test_a_cassette_keeps_line_separators(tmp_path):
    from reach_nb.llm.models import RecordingLLM, ReplayLLM
    reply = json.dumps({'thought': f'a{BREAKS}b', 'answer': f'c{BREAKS}d'}, ensure_ascii=False)
    live = ReActAgent(RecordingLLM(ScriptedLLM([reply]), tmp_path/'c.jsonl'), []).run('q')
    replayed = ReActAgent(ReplayLLM(tmp_path/'c.jsonl'), []).run('q')
    assert replayed.answer == live.answer == f'c{BREAKS}d'


def test_a_trace_cut_at_any_byte_loads_its_whole_lines(tmp_path):
    "Every cut of a real trace (inside lines, inside multi-byte characters) loads the intact events before it."
    data = _real_trace(tmp_path, REPLIES).read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord('\n')]
    cuts = set(range(ends[0], len(data), 13)) | set(ends[:-1]) | {e - 1 for e in ends[1:]}
    assert any(data[n - 1] >= 0x80 and data[n] >= 0x80 for n in cuts)  # some cuts fall inside a character
    cut = tmp_path/'cut.jsonl'
    for n in sorted(cuts):
        cut.write_bytes(data[:n])
        intact = n in ends or n + 1 in ends  # cut at a line's end, or only its newline lost
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            run, events = Run.load(cut), read_trace(cut)
        assert len(caught) == (0 if intact else 2), (n, [str(w.message) for w in caught])
        assert len(events) == sum(e <= n for e in ends) + (n + 1 in ends), n
        assert run.status == ('finished' if n + 1 == len(data) else 'incomplete'), n
        assert run.meta.get('incomplete', False) == (run.status == 'incomplete'), n


def test_files_that_are_not_traces_are_named(tmp_path):
    p = tmp_path/'notes.jsonl'
    p.write_bytes(b'PK\x03\x04\x14\x00\x00\x00binary zip')
    with pytest.raises(UserError, match=f'a binary file, not a trace in {p}'): Run.load(p)
    p.write_bytes('{"type": "run_start", "question": "q"}\n'.encode('utf-16'))
    with pytest.raises(UserError, match='a binary file'): Run.load(p)
    p.write_bytes('{"type": "run_start", "question": "é"}\n'.encode('latin-1'))
    with pytest.raises(UserError, match=r'not UTF-8 text \(byte 0xe9'): Run.load(p)
    lines = _real_trace(tmp_path, REPLIES).read_text(encoding='utf-8').splitlines()
    p.write_text('\n'.join(lines[:2] + ['{"type": "step_end"}'] + lines[2:]) + '\n', encoding='utf-8')
    with pytest.raises(UserError, match=f'line 3 is not a reach_nb event .* in {p}:3: '): Run.load(p)


def _load_as_another_user(path, q):
    "In a child process: give up root (the test runs as root in containers) so file permissions apply, then load."
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    try: Run.load(path)
    except UserError as e: q.put(('UserError', str(e)))
    except Exception as e: q.put((type(e).__name__, str(e)))
    else: q.put(('loaded', ''))


def test_a_path_with_no_readable_trace_is_a_user_error_naming_it(tmp_path):
    kept = Run(question='q').save(tmp_path/'runs'/'kept.jsonl')
    (tmp_path/'notes.txt').write_text('Recharge volume doubled.\nAsk the channel team.\n')
    (tmp_path/'one.json').write_text('{"model": "qwen-plus"}')
    cases = {tmp_path/'missing.jsonl': 'no such file', tmp_path/'runs': f'a folder, not a trace file in {kept.parent}: '
             f'give a trace file in it, e.g. {kept}', tmp_path/'notes.txt': 'not a reach_nb trace: line 1 is not an event',
             tmp_path/'one.json': 'not a reach_nb trace: line 1 is not an event', kept/'x.jsonl': 'the file cannot be read'}
    for path, says in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # and no "cut short" warning on the way
            with pytest.raises(UserError) as e: Run.load(path)
        assert says in str(e.value) and str(path) in str(e.value), (path, str(e.value))
        assert '\n' not in str(e.value) and 'Errno' not in str(e.value)


def test_an_unreadable_trace_is_a_user_error_naming_it(tmp_path):
    path = Run(question='q').save(tmp_path/'secret.jsonl')
    path.chmod(0)
    tmp_path.chmod(0o755)
    ctx = multiprocessing.get_context('fork')
    q = ctx.Queue()
    child = ctx.Process(target=_load_as_another_user, args=(path, q))
    child.start()
    child.join(30)
    assert q.get(timeout=5) == ('UserError', f'no permission to read the file in {path}: check its permissions or copy it')


def test_the_viewer_says_the_same(tmp_path):
    from reach_nb.viewer.widget import RunViewer
    with pytest.raises(UserError, match=f'no such file in {tmp_path}/missing.jsonl: check the path'):
        RunViewer(str(tmp_path/'missing.jsonl'))
    with pytest.raises(UserError, match=f'a folder, not a trace file in {tmp_path}: give the path of a trace file in it'):
        RunViewer(tmp_path)


def test_a_page_is_written_whole_whatever_the_run_holds(tmp_path):
    from reach_nb.viewer.widget import RunViewer
    import reach_nb.viewer.share  # noqa: F401  (RunViewer.to_html)
    run = Run.load(_real_trace(tmp_path, REPLIES))
    page = RunViewer(run).to_html(tmp_path/'run.html')
    before = page.read_bytes()
    odd = run.model_copy(update={'answer': 'resold \ud800 gems'})
    RunViewer(odd).to_html(page)  # the lone surrogate is replaced, the page written whole
    assert 'resold \ufffd gems' in page.read_text(encoding='utf-8') and page.read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['run.html', 'run.jsonl']  # no temporary file left
