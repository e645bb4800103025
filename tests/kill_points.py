"""What the kill-and-resume tests' child processes share: a store that stops for good at a chosen event."""
import time


def stop_at(store, kind:str, nth:int):
    "Make `store` stop for good right after storing the `nth` event of type `kind`, saying so on stdout."
    append, seen = store.append, [0]
    def hooked(run_id, e):
        append(run_id, e)
        if e.type == kind:
            seen[0] += 1
            if seen[0] == nth: print('KILL-POINT', run_id, flush=True); time.sleep(300)
    store.append = hooked
