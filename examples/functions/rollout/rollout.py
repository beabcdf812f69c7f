"""Example RL rollout: play one episode of a small gridworld with a softmax policy.

Input: ``{"seed": int, "logits": [[4 floats] per cell] (optional), "size": int, "max_steps": int}``.
Output: ``{"return": float, "steps": int, "reached_goal": bool, "actions": [...]}``.
Deterministic for a given seed and policy, like a rollout worker should be.
"""

import math
import random

MOVES = [(0, 1), (1, 0), (0, -1), (-1, 0)]


def rollout(request):
    size = int(request.get("size", 5))
    rng = random.Random(request.get("seed", 0))
    logits = request.get("logits") or [[0.0, 0.0, 0.0, 0.0] for _ in range(size * size)]
    x = y = 0
    total, actions = 0.0, []
    for step in range(int(request.get("max_steps", 50))):
        weights = [math.exp(v) for v in logits[y * size + x]]
        action = rng.choices(range(4), weights=weights)[0]
        actions.append(action)
        dx, dy = MOVES[action]
        x, y = min(max(x + dx, 0), size - 1), min(max(y + dy, 0), size - 1)
        total -= 0.01
        if (x, y) == (size - 1, size - 1):
            return {
                "return": total + 1.0,
                "steps": step + 1,
                "reached_goal": True,
                "actions": actions,
            }
    return {"return": total, "steps": len(actions), "reached_goal": False, "actions": actions}
