"""The smallest function: returns its input. Used by the latency benchmarks."""


def noop(request):
    return request
