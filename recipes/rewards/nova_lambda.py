"""A reward Lambda written to Amazon Nova's reward contract only (no forge import), runnable as an
AWS Lambda (handler `nova_lambda.lambda_handler`) and, unchanged, by forge with `protocol: nova`.

Nova calls `lambda_handler(event, context)` with a list of samples, each `{"id", "messages" (the
prompt and the generated assistant turn last), "reference_answer" / "metadata"}`, and expects one
`{"id", "aggregate_reward_score", "metrics_list": [{"name", "value", "type"}]}` per sample;
"Reward" entries are the parts of the score, "Metric" entries are only logged
(https://docs.aws.amazon.com/sagemaker/latest/dg/nova-implementing-reward-functions.html).

The task (recipes/nova_rft.yaml): a one-sentence story about the animal the prompt names, ending
with a full stop, at most `max_words` words.
"""


def _reference(sample):
    ref = sample.get("reference_answer")
    if ref is None:  # the Nova user guide's form: the reference inside metadata
        ref = (sample.get("metadata") or {}).get("reference_answer")
    return ref if isinstance(ref, dict) else {}


def score(sample):
    reply = sample["messages"][-1]["content"] if sample.get("messages") else ""
    ref = _reference(sample)
    words = reply.split()
    animal = str(ref.get("animal", "")).lower()
    mentions = float(bool(animal) and animal in reply.lower())
    full_stop = float(reply.strip().endswith("."))
    short = float(0 < len(words) <= int(ref.get("max_words", 20)))
    return {
        "id": sample["id"],
        "aggregate_reward_score": (mentions + full_stop + short) / 3,
        "metrics_list": [
            {"name": "mentions_animal", "value": mentions, "type": "Reward"},
            {"name": "full_stop", "value": full_stop, "type": "Reward"},
            {"name": "short", "value": short, "type": "Reward"},
            {"name": "words", "value": float(len(words)), "type": "Metric"},
        ],
    }


def lambda_handler(event, context):
    samples = event if isinstance(event, list) else [event]
    return [score(s) for s in samples]
