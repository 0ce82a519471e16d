"""Reward Lambdas written to Amazon Nova's contract (lambda_handler(event, context) -> list of
{id, aggregate_reward_score, metrics_list}), for the tests; some break the contract on purpose."""
import math
import time


def e_share(event, context):
    """The RFT tests' toy task in Nova's form: the share of 'e' in the reply is the Reward, its
    length a Metric."""
    out = []
    for sample in event:
        reply = sample["messages"][-1]["content"]
        share = sum(ch == "e" for ch in reply) / max(1, len(reply))
        out.append({"id": sample["id"], "aggregate_reward_score": share,
                    "metrics_list": [{"name": "e_share", "value": share, "type": "Reward"},
                                     {"name": "length", "value": float(len(reply)), "type": "Metric"}]})
    return out


def broken(event, context):
    """Every kind of breach: a dropped sample, a repeated id, a text score, a NaN, a bad metric type."""
    ids = [s["id"] for s in event]
    return [{"id": ids[0], "aggregate_reward_score": "0.5"},
            {"id": ids[0], "aggregate_reward_score": 1.0},
            {"id": ids[1], "aggregate_reward_score": math.nan,
             "metrics_list": [{"name": "x", "value": 1.0, "type": "Score"}]}]


def hangs(event, context):
    time.sleep(30)
    return []


def remaining(event, context):
    """Scores the milliseconds the local context says are left (and echoes its function name)."""
    ms = context.get_remaining_time_in_millis()
    return [{"id": s["id"], "aggregate_reward_score": float(ms > 0),
             "metrics_list": [{"name": context.function_name, "value": 1.0, "type": "Metric"}]} for s in event]
