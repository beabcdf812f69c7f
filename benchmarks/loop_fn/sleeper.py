"""A fixed-duration job body for the loop benchmarks: sleeps ``input["s"]`` seconds."""

import time


def run(request):
    time.sleep(float(request["s"]))
    return {"slept": request["s"]}
