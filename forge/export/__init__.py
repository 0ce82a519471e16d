"""Export a Novella in the Hugging Face layout of an export format (`formats`: Amazon Bedrock Custom
Model Import, or any Hugging Face runtime) and deploy it: `layout.export` (the format's checks, such
as `bedrock`'s, `compat` translation to transformers 4.51.3, `verify` round trip) and `deploy.deploy`
(S3 upload and import job). CLI: `command`."""
