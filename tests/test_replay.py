"A run against a real HTTP endpoint, recorded once, replays byte for byte offline."
from reach_nb.demo import demo_model, lookup, ratio, DEMO_QUESTION
from reach_nb.llm import OpenAIChat, RecordingLLM, ReplayLLM, CassetteMismatch
from reach_nb.modelserver import ModelServer
from reach_nb.react import ReActAgent
import pytest

def _essentials(run):
    return [(s.raw, s.parse_level, [str(a) for a in s.actions], [o.content for o in s.observations], s.answer, s.usage.prompt_tokens, s.usage.completion_tokens)
            for s in run.steps]

def test_recorded_http_run_replays_identically(tmp_path):
    cassette = tmp_path/'demo.cassette.jsonl'
    with ModelServer(demo_model(), model_name='demo-analyst') as srv:
        live_llm = RecordingLLM(OpenAIChat('demo-analyst', base_url=srv.base_url, max_retries=0), cassette)
        live = ReActAgent(live_llm, [lookup, ratio]).run(DEMO_QUESTION)
    assert live.stop_reason == 'answer' and len(live.steps) == 4
    replayed = ReActAgent(ReplayLLM(cassette), [lookup, ratio]).run(DEMO_QUESTION)
    assert _essentials(replayed) == _essentials(live)
    assert replayed.answer == live.answer

def test_replay_refuses_a_different_conversation(tmp_path):
    cassette = tmp_path/'demo.cassette.jsonl'
    ReActAgent(RecordingLLM(demo_model(), cassette), [lookup, ratio]).run(DEMO_QUESTION)
    with pytest.raises(CassetteMismatch):
        ReplayLLM(cassette).chat([{'role': 'user', 'content': 'something else'}], json_mode=True)
