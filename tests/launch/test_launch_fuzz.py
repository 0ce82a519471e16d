"""Fuzz forge launch's renderers with names, paths, environment values and image names from the
whole of Unicode (NUL and lone surrogates aside: no argv or file name holds them) mixed with shell
and YAML metacharacters: every script passes `bash -n` and, run with the programs it starts
replaced by stubs, gives torchrun exactly the intended words and runs nothing else; every YAML file
parses back to the document forge made; the Kubernetes args reach torchrun as written once
Kubernetes has expanded them; an image or claim Kubernetes would refuse is refused in one line."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from forge.errors import ForgeError
from forge.launch import kubernetes, sagemaker, slurm, torchrun
from forge.launch.command import header
from forge.launch.layout import PORT, Launch
from launch_scripts import bash_n, run_script

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DANGER = ["$(touch M)", "`touch M`", "${PATH}", "$HOME", "$$(RANK)", "$(RANK)", "'", '"', "\\", "\n", "\r",
          "\u2028", "\x85", "; touch M", "# ", "!", "*", "~", ": ", "- ", "{", "}", "%", "&&", "|", "\t", " "]
CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
WORD = st.lists(st.one_of(st.sampled_from(DANGER), st.text(CHARS, max_size=8)), max_size=5).map("".join)
NONEMPTY = WORD.filter(bool)


def make_launch(recipe: str, name: str, nodes: int, overrides: list[str], notes: list[str], stage: str) -> Launch:
    plan = SimpleNamespace(stage=stage, layout=f"dp{8 * nodes}", target="p5.48xlarge", chips=8 * nodes,
                           step_time_s=1.5, hours=2.0, cost_usd=100.0)
    return Launch(recipe, name, "p5.48xlarge", "h100", "fsdp", "fsdp", 8 * nodes, nodes, 8, 1, "nccl",
                  tuple(overrides), [plan], tuple(notes))


def k8s_expand(word: str, env: dict[str, str]) -> str:
    """What Kubernetes makes of a container arg: $$ is one $, $(VAR) a defined variable's value."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif (m := re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)").match(word, i)) and m.group(1) in env:
            out.append(env[m.group(1)])
            i = m.end()
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


@FUZZ
@given(recipe=WORD, name=WORD, nodes=st.sampled_from([1, 2]), overrides=st.lists(WORD, max_size=3),
       notes=st.lists(WORD, max_size=2), stage=WORD, moved=st.lists(WORD, max_size=2), rank=NONEMPTY,
       addr=NONEMPTY)
def test_scripts_run_only_the_intended_words(tmp_path, recipe, name, nodes, overrides, notes, stage, moved, rank,
                                             addr):
    launch = make_launch(f"/data/{recipe}.yaml", name, nodes, overrides, notes, stage)
    head, run = header(launch), launch.run_args()
    env = {"NODE_RANK": rank, "MASTER_ADDR": addr}
    per = ["--nnodes", str(nodes), "--nproc-per-node", "8"]
    want_torchrun = (["--standalone", *per] if nodes == 1 else
                     [*per, "--node-rank", rank, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:{PORT}",
                      "--rdzv-id", f"forge-{name}"]) + run
    want_slurm = ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  f"node-0:{PORT}", "--rdzv-id", "77", *run]
    recipe_file = Path(launch.recipe).name
    want_sm = [*per, "--node-rank", "0", "--master-addr", "0", "--master-port", str(PORT),
               *launch.run_args(f"{sagemaker.ML}/recipe/{recipe_file}", tuple(moved))]
    scripts = [(torchrun.render(launch, head)[torchrun.SCRIPT], want_torchrun),
               (slurm.render(launch, head, True)[slurm.SCRIPT], want_slurm),
               (sagemaker.entry_script(launch, recipe_file, tuple(moved)), want_sm)]
    for text, want in scripts:
        checked = bash_n(text, tmp_path)
        assert checked.returncode == 0, checked.stderr
        assert run_script(text, tmp_path, env) == want
    accel = torchrun.render(launch, head)[torchrun.ACCELERATE]
    assert yaml.safe_load(accel) == torchrun.accelerate_config(launch)


IMAGE = st.from_regex(r"\A([a-z0-9.-]{1,12}(:[0-9]{1,5})?/)?[a-z0-9]{1,8}(/[a-z0-9]{1,8})?(:[A-Za-z0-9_.-]{1,12})?\Z")
CLAIM = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?\Z")


@FUZZ
@given(recipe=WORD, name=WORD, nodes=st.sampled_from([1, 2]), overrides=st.lists(WORD, max_size=3),
       notes=st.lists(WORD, max_size=2), image=st.one_of(IMAGE, WORD), claim=st.one_of(CLAIM, WORD),
       workdir=st.one_of(st.just("/workspace"), WORD.map(lambda w: "/" + w)))
def test_the_pytorchjob_parses_back_and_its_args_reach_torchrun_as_written(recipe, name, nodes, overrides, notes,
                                                                         image, claim, workdir):
    launch = make_launch(f"/data/{recipe}.yaml", name, nodes, overrides, notes, "cpt")
    try:
        text = kubernetes.render(launch, header(launch), image, workdir, claim, "nvidia.com/gpu")[kubernetes.MANIFEST]
    except ForgeError as e:
        message = str(e)
        assert "\n" not in message and message.startswith(("--image ", "--volume-claim ", "--workdir "))
        assert (kubernetes.IMAGE.fullmatch(image) is None or not workdir.isprintable()
                or kubernetes.DNS_SUBDOMAIN.fullmatch(claim) is None)
        return
    doc = yaml.safe_load(text)
    assert doc == kubernetes.manifest(launch, image, workdir, claim, "nvidia.com/gpu")
    container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == image and container["workingDir"] == workdir
    env = {"RANK": "1", "MASTER_ADDR": "head", "MASTER_PORT": "23456"}
    args = [k8s_expand(a, env) for a in container["args"]]
    assert args[args.index("-m"):] == launch.run_args()
    assert all(line.startswith("#") for line in text.splitlines()[:len(header(launch))])
