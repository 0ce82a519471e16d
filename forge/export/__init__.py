"""Export a Novella in the layout Amazon Bedrock Custom Model Import (or any Hugging Face runtime)
accepts, and deploy it: `layout.export` (with `bedrock` rules, `compat` translation to transformers
4.51.3, `verify` round trip) and `deploy.deploy` (S3 upload and import job). CLI: `command`."""
