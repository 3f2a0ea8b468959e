# The image docker-compose.yml runs: the package and its examples.
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY celery_funnel ./celery_funnel
RUN pip install --no-cache-dir .
COPY examples ./examples
RUN useradd --create-home funnel
USER funnel
