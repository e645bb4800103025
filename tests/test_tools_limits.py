"The tool registry under hostile load: hung tools, huge names, many calls at once."
import threading, time
from concurrent.futures import ThreadPoolExecutor
from reach_nb.tools import MAX_WORKERS, ToolRegistry, _workers, suggest_name

def _workers_alive() -> int:
    return sum(t.name == 'reach_nb.tools worker' for t in threading.enumerate())

def _finishes(fn, seconds:float) -> bool:
    "Whether `fn()` returns within `seconds` (a guard against pathological slowness, not a benchmark)."
    t = threading.Thread(target=fn, daemon=True)
    t.start(); t.join(seconds)
    return not t.is_alive()

def test_hung_calls_leave_a_bounded_number_of_threads():
    release = threading.Event()
    def hang(x:int): # a number
        "Block until released."
        release.wait(60); return x
    reg = ToolRegistry([hang], timeout=0.05)
    try:
        # off the main thread each sync call goes to a worker, which a hung call holds
        with ThreadPoolExecutor(1) as ex:
            obs = ex.submit(lambda: [reg.call('hang', {'x': i}) for i in range(50)]).result()
        assert all(o.error == 'timeout' for o in obs)
        assert _workers_alive() <= MAX_WORKERS == _workers.max_threads == 32
        busy = [o for o in obs if 'could not start' in o.content]
        assert len(busy) >= 50 - MAX_WORKERS and 'worker threads are held by earlier calls' in busy[0].content
    finally: release.set()
    time.sleep(0.2)
    assert reg.call('hang', {'x': 7}).content == '7'  # the threads are free again

def test_on_the_main_thread_a_hung_call_is_stopped_and_holds_no_thread():
    woke = []
    def hang(x:int): # a number
        "Block for a minute, then note that it woke."
        threading.Event().wait(60); woke.append(x); return x
    reg, before = ToolRegistry([hang], timeout=0.05), _workers_alive()
    t = time.perf_counter()
    obs = [reg.call('hang', {'x': i}) for i in range(20)]
    assert time.perf_counter() - t < 10
    assert all(o.error == 'timeout' and 'was stopped' in o.content for o in obs), obs[0].content
    assert woke == [] and _workers_alive() == before  # stopped, not left running in a thread

NINE = ['list_datasets', 'describe_dataset', 'list_operators', 'create_procedure', 'create_task', 'list_tasks', 'run_task',
        'get_result', 'search_knowledge']

def test_did_you_mean_on_a_huge_name_is_quick():
    "Fuzzy matching a 10 MB name against nine tools took 17-43 s before names were cut to 200 characters."
    huge = 'aB' * 5_000_000
    reg = ToolRegistry([wide])
    assert _finishes(lambda: suggest_name(huge, NINE), 10)
    assert _finishes(lambda: reg.call(huge, {}), 10)
    assert _finishes(lambda: reg.call('wide', {huge: 'x', 'list_datasets': 'y'}), 10)
    ob = reg.call('wide', {huge[:300]: 'x', 'list_datasets': 'y'})
    assert ob.error == 'bad_args' and len(ob.content) < 4000

def wide(list_datasets:str='', describe_dataset:str='', list_operators:str='', create_procedure:str='', create_task:str='',
         list_tasks:str='', run_task:str='', get_result:str='', search_knowledge:str=''):
    "A tool with nine parameters, for parameter-name suggestions."
    return list_datasets


def test_a_burst_from_many_threads_runs_every_job_once_and_leaves_the_pool_counted_right():
    "Jobs submitted from 40 threads to a pool of 8: each runs once, no more than 8 threads, all counted idle after."
    from reach_nb.tools import _Workers
    pool, ran, lock = _Workers(8), [], threading.Lock()
    def job(k, j):
        if j % 7 == 0: time.sleep(0.0003)
        with lock: ran.append((k, j))
        return k * 1000 + j
    def client(k):
        for j in range(100): assert pool.submit(job, k, j).result(10) == k * 1000 + j
    clients = [threading.Thread(target=client, args=(k,)) for k in range(40)]
    for t in clients: t.start()
    for t in clients: t.join()
    time.sleep(0.2)  # the last workers go back to waiting
    assert sorted(ran) == [(k, j) for k in range(40) for j in range(100)]
    assert pool.threads == pool._idle <= 8

def test_an_alarm_that_is_not_reach_nbs_still_ends_the_process():
    "After a call has put reach_nb's SIGALRM handler in place, an alarm of the program's own does what the default does."
    import signal, subprocess, sys
    code = ("import signal, time\nfrom reach_nb.tools import ToolRegistry\n"
            "def echo(x:int): # a number\n    'Return it.'\n    return x\n"
            "assert ToolRegistry([echo], timeout=5).call('echo', {'x': 1}).content == '1'\n"
            "signal.setitimer(signal.ITIMER_REAL, 0.05)\ntime.sleep(5)\nprint('survived')\n")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (-signal.SIGALRM, ''), r

def test_a_program_with_its_own_alarm_handler_keeps_it():
    import signal
    rang = []
    before = signal.signal(signal.SIGALRM, lambda *a: rang.append(1))
    try:
        def whoami() -> str:
            "The thread running this tool."
            return threading.current_thread().name
        assert ToolRegistry([whoami], timeout=5).call('whoami').content == 'reach_nb.tools worker'
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        time.sleep(0.2)
        assert rang == [1]
    finally: signal.signal(signal.SIGALRM, before)
