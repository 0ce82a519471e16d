"""The python, lambda and judge transports (forge.recipe.reward_table's TRANSPORTS name their builders;
the http one is forge.lm.reward_http):

- python, `path/to/file.py:function` or `package.module:function`: a callable, sync or async, run in
  a worker process of its own (forge.lm.reward_workers) that is killed when a call overruns; a bad
  file or module fails when it is built;
- lambda, `lambda:<name or ARN>`: an AWS Lambda function invoked through boto3 with the contract's
  JSON, in chunks (botocore's connect and read timeouts are `timeout_s`);
- judge, `judge:<address>`: an LLM judge (forge.lm.judges) grading each completion, or each prompt's
  group, with the source's `judge:` rubric; its verdicts are cached in the setup's `cache_dir`.
"""
from __future__ import annotations

import json
from typing import Any

from forge.errors import ForgeError
from forge.lm.reward_channel import Chunk, Chunked, ContractCode, Deadline, RewardError, Setup, map_chunks
from forge.lm.reward_workers import RewardWorker
from forge.recipe.judge import JudgeOptions
from forge.recipe.rft_settings import RewardSource
from forge.usercode import split_spec


class Worker:
    def __init__(self, spec: RewardSource, setup: Setup):
        split_spec(spec.source, "reward")
        self.timeout_s = spec.timeout_s
        self.worker = RewardWorker(spec.source, None if setup.root is None else str(setup.root))

    def send(self, payload: Any, contract: ContractCode, where: str) -> object:
        if contract.calls == "event":
            return self.worker.call_event(payload, self.timeout_s)
        prompts, completions, fields = payload
        return self.worker.call(prompts, completions, fields, self.timeout_s)

    def close(self) -> None:
        self.worker.close()


def python(spec: RewardSource, setup: Setup) -> Worker:
    return Worker(spec, setup)


class AwsLambda:
    def __init__(self, spec: RewardSource, setup: Setup):
        self.spec, self.client, self.name = spec, setup.client, spec.source.removeprefix("lambda:")

    def send(self, payload: Any, contract: ContractCode, where: str) -> object:
        client = self.client or _boto_lambda(self.spec, where)

        def invoke(chunk: Chunk) -> object:
            resp = client.invoke(FunctionName=self.name, InvocationType="RequestResponse",
                                 Payload=json.dumps(chunk).encode())
            answer = json.loads(resp["Payload"].read() or b"null")
            if resp.get("FunctionError"):
                raise RewardError(f"{where}: the Lambda function failed ({resp['FunctionError']}): {answer}")
            return answer
        chunks = contract.split(payload, self.spec.batch_size)
        return map_chunks(invoke, Chunked(contract, chunks, self.spec.concurrency), Deadline(self.spec.timeout_s))

    def close(self) -> None:
        return None


def aws_lambda(spec: RewardSource, setup: Setup) -> AwsLambda:
    return AwsLambda(spec, setup)


def _boto_lambda(spec: RewardSource, where: str) -> Any:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import NoRegionError
    except ImportError:
        raise ForgeError("a lambda: reward needs boto3 (pip install 'forge[aws]')") from None
    config = Config(connect_timeout=spec.timeout_s, read_timeout=spec.timeout_s,
                    retries={"total_max_attempts": spec.retries + 1, "mode": "standard"})
    try:
        return boto3.client("lambda", region_name=spec.region, config=config)
    except NoRegionError:
        raise RewardError(f"{where}: no AWS region: set the reward's `region` (or --region), or AWS_REGION") from None


class Judged:
    """A judge speaks forge's contract only (the recipe refuses another): the payload is (prompts,
    completions, fields) and the answer the judge's scores."""

    def __init__(self, spec: RewardSource, setup: Setup):
        from forge.lm.judges import Judge, Reach  # torch and transformers: only when a judge is named

        reach = Reach(spec.timeout_s, spec.retries, spec.region, setup.client)
        self.judge = Judge(spec.source, spec.judge or JudgeOptions.model_validate({}), setup.cache_dir, reach)

    def send(self, payload: Any, contract: ContractCode, where: str) -> object:
        prompts, completions, fields = payload
        try:
            return self.judge.score(prompts, completions, fields)
        except RewardError:
            raise
        except ForgeError as e:
            raise RewardError(f"{where}: {e}") from None

    def close(self) -> None:
        self.judge.close()


def judge(spec: RewardSource, setup: Setup) -> Judged:
    return Judged(spec, setup)
