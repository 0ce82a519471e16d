"""Environments for the agentic RFT tests (named by file path in the stages under test)."""


class Adder:
    """A tool (add) the policy may call; the first turn without a tool call is its answer."""

    def __init__(self):
        self.tools = {"add": lambda a, b: str(a + b)}
        self.task = {}

    def reset(self, task):
        self.task = task
        return task["prompt"]

    def step(self, action):
        return None, float(self.task.get("answer", "5") in action), True


class Chatty:
    """Never done: every turn earns 0.5 and a user reply."""

    def reset(self, task):
        return None  # the task's own prompt messages

    def step(self, action):
        return "go on", 0.5, False


class DoneSecond:
    def __init__(self):
        self.turns = 0

    def reset(self, task):
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["prompt"]}]

    def step(self, action):
        self.turns += 1
        return {"role": "user", "content": "again"}, 1.0, self.turns == 2


class NoStep:
    def reset(self, task):
        return task["prompt"]


class BadReward:
    def reset(self, task):
        return task["prompt"]

    def step(self, action):
        return None, float("nan"), True
