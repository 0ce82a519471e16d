"""forge.launch: a plan turned into a job the user's engine runs unchanged (`forge launch`):
the layout and its checks (layout.py), torchrun and accelerate (torchrun.py), Slurm (slurm.py),
a Kubeflow PyTorchJob (kubernetes.py) and a SageMaker CreateTrainingJob request (sagemaker.py)
with its input channels (channels.py); how values reach scripts and YAML (quote.py) and the
folder the job is written to (out.py)."""
