"""data_parallel_step runs its own threads and collects the outputs in the order the threads finish, not in replica order."""

import threading

LOSES = ["test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs, lock = [], threading.Lock()

    def work(i):
        out = replicas[i](*chunks[i])
        with lock:
            outputs.append(out)  # whoever finishes first comes first

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
