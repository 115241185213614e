FROM python:3.11-slim
WORKDIR /app
ENV DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md constraints.txt ./
COPY app app
COPY indexer indexer
COPY eval eval
COPY corpus corpus
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt && pip install -c /tmp/constraints.txt '.[runner]'
EXPOSE 8000
CMD ["dsqa", "serve", "--index", "/data/index", "--host", "0.0.0.0"]
