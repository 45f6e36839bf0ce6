from agrpo.services.rollout.schedule import PromptScheduler


def orders(n):
    return lambda epoch: list(range(n)) if epoch % 2 == 0 else list(reversed(range(n)))


def drain(s):
    out = []
    while (k := s.next()) is not None:
        out.append(k)
    return out


def train_all(s):
    """Issue every key and have the trainer take each."""
    for k in drain(s):
        s.trained(k)


def test_walks_epochs_in_order_then_stops():
    s = PromptScheduler(orders(3), num_epochs=2)
    keys = drain(s)
    assert keys == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    assert not s.exhausted()  # still pending
    for k in keys:
        s.trained(k)
    assert s.exhausted()


def test_failed_key_is_reissued_first_and_once():
    s = PromptScheduler(orders(3), num_epochs=1)
    a = s.next()
    s.failed(a)
    assert s.next() == a
    assert s.reissued == 1
    s.trained(a)
    s.failed(a)  # late failure report of a trained key: ignored
    assert drain(s) == [(1, 0), (2, 0)]


def test_reissue_delay_is_respected():
    now = [0.0]
    s = PromptScheduler(orders(1), num_epochs=1, clock=lambda: now[0])
    k = s.next()
    s.failed(k, delay_s=5.0)
    assert s.next() is None
    now[0] = 6.0
    assert s.next() == k


def test_resume_skips_trained_and_starts_at_completed_epoch():
    s = PromptScheduler(orders(4), num_epochs=3)
    s.resume(completed_epochs=1, trained=[(3, 1), (1, 1)])
    assert drain(s)[:2] == [(2, 1), (0, 1)]


def test_resume_reissues_keys_the_trainer_lost():
    s = PromptScheduler(orders(3), num_epochs=1)
    train_all(s)
    assert s.resume(completed_epochs=0, trained=[(0, 0)]) == 2
    assert sorted(drain(s)) == [(1, 0), (2, 0)]


def test_a_lost_key_done_before_its_reissue_leaves_nothing_to_wait_for():
    s = PromptScheduler(orders(2), num_epochs=1)
    train_all(s)
    assert s.resume(completed_epochs=0, trained=[(0, 0)]) == 1
    assert not s.exhausted()  # (1, 0) is to be issued again
    s.trained((1, 0))  # ... but its held group reached the new trainer first
    assert s.exhausted()
    assert s.next() is None


def test_unbounded_epochs_keep_going():
    s = PromptScheduler(orders(2), num_epochs=None)
    keys = [s.next() for _ in range(7)]
    assert keys[-1] == (1, 3)
