"""The parser against very large and hostile replies: each call must return (or raise only ValueError, for
`parse_call`) with the right result. Each input runs in a child process under a generous bound, so a
regression to quadratic work fails the test instead of hanging the suite; the assertions are on results."""
import multiprocessing as mp, random, tracemalloc
import pytest
from reach_nb.parse import (MAX_REPLY_CHARS, MAX_DEPTH, ParseResult, parse_json, parse_call, extract_tool_calls,
                            split_reasoning, correction_message, _excerpt)

BOUND = 120  # seconds; a linear parse of these inputs takes well under one

def _child(conn, fn, args):
    try: conn.send(('ok', fn(*args)))
    except ValueError as e: conn.send(('ValueError', str(e)))
    except BaseException as e: conn.send(('raised', f'{type(e).__name__}: {e}'))

# forked from a clean server process: a plain fork of the test process could inherit a lock another thread holds
CHILDREN = mp.get_context('forkserver')

def finishes(fn, *args):
    "`fn(*args)` run in a child process: ('ok', result), ('ValueError', message) or ('raised', what)."
    parent, child = CHILDREN.Pipe(duplex=False)
    p = CHILDREN.Process(target=_child, args=(child, fn, args), daemon=True)
    p.start()
    got = parent.recv() if parent.poll(BOUND) else None
    if got is None: p.kill()
    p.join()
    assert got is not None, f"{getattr(fn, '__name__', fn)} did not return within {BOUND} s on {len(args[0]):,} chars"
    return got

def parse_outcome(text): r = parse_json(text); return r.level, r.problem, r.error
def call_outcome(text): return parse_call(text)

def test_fifty_megabytes_unclosed_string_is_refused_for_its_size():
    text = '{"thought": "' + 'x' * 50_000_000
    status, (level, problem, error) = finishes(parse_outcome, text)
    assert (status, level, problem) == ('ok', 'failed', 'too_long')
    assert error.startswith('The reply was 50,000,013 characters, more than the limit of 200,000.')
    assert finishes(extract_tool_calls, text) == ('ok', None)
    status, msg = finishes(call_outcome, text)
    assert status == 'ValueError' and 'more than the limit of 200,000' in msg

def test_excerpt_of_a_huge_reply_looks_only_at_what_it_quotes():
    raw = 'a ' * 2_500_000 + 'END'
    tracemalloc.start()
    got = _excerpt(raw, 240)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got.startswith('«a a a') and got.endswith('a a END»') and ' … ' in got and len(got) < 260
    assert peak < 1_000_000, peak   # splitting the whole reply into words would take hundreds of megabytes
    r = ParseResult(raw=raw, problem='invalid', error='Invalid JSON.')
    assert len(correction_message(r, '{"answer": "..."}')) < 600

FORMAT = '{"thought": "...", "answer": "..."}'

def everything(text):
    "What every public entry point makes of `text`: parse level and problem, calls found, parse_call's outcome."
    r = parse_json(text)
    try: parse_call(text); call = 'ok'
    except ValueError: call = 'ValueError'
    split_reasoning(text)
    msg = correction_message(r, FORMAT) if not r.ok else ''
    return r.level, r.problem, extract_tool_calls(text), call, len(msg) < 2000

def fill(unit, prefix='', suffix=''):
    "`prefix`, `unit` repeated, `suffix`: as long as a reply may be."
    n = (MAX_REPLY_CHARS - len(prefix) - len(suffix)) // len(unit)
    return prefix + unit * n + suffix

HOSTILE = [  # (name, reply, parse_json's problem) -- each once took minutes, or raised
    ('many tags', fill('<a>'), 'no_object'),
    ('a quote, then escaped quotes', fill('\\"', '"'), 'no_object'),
    ('think openers', fill('<think>'), 'no_object'),
    ('tags before braces', fill('<a>{'), 'invalid'),
    ('prose with braces', fill('x {a} '), 'invalid'),
    ('unbalanced quotes, many candidates', fill('“”}', '{"a": “'), 'invalid'),
    ('end tags', fill('<end>', '{"a": 1'), 'invalid'),
    ('an unclosed string', fill('x', '{"a": "'), 'truncated'),
    ('deep nesting', fill('[', '{"a": '), 'invalid'),
    ('open braces', fill('{'), 'invalid'),
    ('bare quotes', fill('x"', '{"a": "', '}'), 'invalid'),
    ('single-quote runs', fill("x'}", "{'a': '' '"), 'invalid'),
    ('a huge number', '{"a": ' + '1' * 100_000 + '}', 'invalid'),
    ('deep valid JSON', '{"a":' * 5000 + '1' + '}' * 5000, 'invalid'),
    ('tool call tags', fill('<tool_call>'), 'no_object'),
    ('mistral markers', fill('[TOOL_CALLS]f'), 'no_object'),
    ('python tags', fill('<|python_tag|>f.call(x='), 'no_object'),
]

@pytest.mark.parametrize('name,text,problem', HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_reply_is_refused_quickly(name, text, problem):
    status, (level, got_problem, calls, call, short_message) = finishes(everything, text)
    assert status == 'ok'
    assert (level, got_problem, calls, call, short_message) == ('failed', problem, None, 'ValueError', True)

def test_many_calls_in_one_reply_are_all_read():
    unit = '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>'
    status, (calls, repairs) = finishes(extract_tool_calls, fill(unit))
    assert status == 'ok' and repairs == ['hermes_tool_call', 'multiple_calls']
    assert len(calls) == MAX_REPLY_CHARS // len(unit) and calls[-1].args == {'n': 1}

def test_many_fenced_calls_in_one_reply_are_all_read():
    "A call in each of many code fences, to the size limit: one pass, every call read."
    unit = '```json\n{"name": "f", "arguments": {"n": 1}}\n```\n\n'
    status, (calls, repairs) = finishes(extract_tool_calls, fill(unit))
    assert status == 'ok' and repairs == ['bare_json_call', 'multiple_calls']
    assert len(calls) == MAX_REPLY_CHARS // len(unit) and calls[-1].args == {'n': 1}
    assert finishes(extract_tool_calls, fill('```json\n{"name": "f",\n')) == ('ok', None)  # fences never closed

ALPHABET = (list('{}[]":,\'\\ \n“”＂‘’＇：，｛｝ax1-.eE#/*<>`()=') +
            ['<a>', '</a>', '<think>', '</think>', '```', '<tool_call>', '</tool_call>', '[TOOL_CALLS]', '<|python_tag|>',
             '<end>', 'true', 'None', '"a":', '"a": "', '\\"', '{"', '"}', '<thought>', '</thought>', '<action>', '{{', '}}'])
PREFIXES = ['', '{"a": "', '{"a": ', "{'a': '", '{“a”：“', '<tool_call>', '[TOOL_CALLS]', '<|python_tag|>', 'f(x=',
            '<think>', '{"a": [', '```json\n{', '<thought>t</thought><action>{']

def random_replies(seed, n):
    "Seeded hostile replies: a short random unit repeated to the size limit, after a random opening."
    rng = random.Random(seed)
    for _ in range(n):
        unit = ''.join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6)))
        yield fill(unit, rng.choice(PREFIXES))

def all_replies(texts): return [everything(t)[:2] for t in texts]

def test_random_hostile_replies_never_raise():
    texts = list(random_replies(2024, 40))
    status, got = finishes(all_replies, texts)
    assert status == 'ok', got
    assert all(level in ('strict', 'repaired', 'failed') for level, _ in got)
