"""`forge serve`: the Tinker API over HTTP, so that the official Tinker SDK (`tinker` on PyPI),
pointed at it with `base_url` / TINKER_BASE_URL, trains LoRA adapters on forge's training core
(each `forward_backward` + `optim_step` pair is one forge training step, forge.train.step),
samples from them, and saves and resumes them as forge checkpoints.

    config.py          serve.yaml: base models, API keys, precision, checkpoints, MLflow tracking
    wire.py            the SDK's JSON requests, read leniently (a newer SDK may add fields)
    proto.py           the SDK's protobuf messages (forward_backward, samples), built in code
    losses.py          Tinker's loss functions: cross_entropy, importance_sampling, ppo
    batch.py           datums -> checked arrays -> padded batches; token log-probs; a batch's loss
    trainer.py         one served model: a forge training session and the step it is accumulating
    sampling.py        samplers (snapshots of adapters) and their samples, on sampling copies of the bases
    checkpoints.py     saved weights: tinker:// paths, their owners, forge checkpoint folders with lineage
    tracking.py        each training client an MLflow run (forge.track)
    registration.py    a save_state checkpoint merged into its base and registered (tracking.register)
    state.py           sessions, heartbeats, models and samplers, each of one API key
    worker.py          the one thread that runs model calls, round-robin across clients, and their futures
    served.py          what the routes share
    app.py             the app, the API-key check, sessions and futures' long polls
    routes_train.py    create_model, get_info, forward_backward, optim_step
    routes_weights.py  save_weights, save_weights_for_sampler, load_weights, training runs and checkpoints
    routes_sample.py   sampling sessions and samples
    command.py         the `forge serve` subcommand

What is served and what answers "unsupported" is in docs/SERVE.md.
"""
