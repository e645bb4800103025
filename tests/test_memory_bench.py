"""`bench_context`: prompt size per call over a 30-step run under each context policy, measured on the loop's own
messages, and whether the answer (which needs a fact from step 3) survives each policy."""
from reach_nb.llm.context import Layered
from reach_nb.llm.models import count_message_tokens
from reach_nb.memory.conversation import FARM_STEP, bench_context, context_run, review_result


def test_observations_are_realistic():
    sizes = [len(review_result(i)) for i in range(1, 31)]
    assert min(sizes) >= 1200 and max(sizes) <= 1400
    assert sum('device farm found' in review_result(i) for i in range(1, 31)) == 1 and FARM_STEP == 3


def test_table_and_figures():
    lines = []
    rows = bench_context(out=lines.append)
    assert len(lines) == 6 and lines[1].split()[1:3] == ['step', '1']
    by = {r['policy'].name + str(getattr(r['policy'], 'summaries', '')): r for r in rows}
    full, window, layered, small = by['full'], by['window'], by['layered2000'], by['layered500']
    assert all(len(r['tokens']) == 31 for r in rows)
    # full grows with every step; window and layered are flat
    assert full['tokens'][29] > 15_000 and full['messages'][29] == 60
    assert max(window['tokens'][4:]) - min(window['tokens'][4:]) < 100
    lay, tight = layered['tokens'], small['tokens']
    assert max(lay) <= 5000 and layered['messages'][29] == 6 and full['tokens'][29] > 5 * lay[29]
    assert tight[29] - tight[19] < 0.05 * tight[19]  # a small share for summaries: flat from step 20 on
    # honest outcome: the fact from step 3 survives full and layered's summaries, not a window or a small share
    assert [full['right'], window['right'], layered['right'], small['right']] == [True, False, True, False]


def test_tokens_are_what_the_model_was_sent():
    r = context_run(Layered(), steps=8)
    assert [count_message_tokens(r['run'].prompt_at(i)) for i in range(1, 10)] == r['tokens']
