# forge in a container: `docker build -t forge . && docker run --rm -v $PWD/runs:/app/runs forge run recipes/quickstart.yaml`
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 TOKENIZERS_PARALLELISM=false
# The CPU build of torch, installed first so forge's requirement is already met.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY forge ./forge
COPY pipelines ./pipelines
COPY recipes ./recipes
RUN pip install .
# forge runs as an unprivileged user that owns only its run folder and home (caches), not the code
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin forge && mkdir -p /app/runs && chown forge:forge /app/runs
USER forge
ENTRYPOINT ["forge"]
CMD ["--help"]
