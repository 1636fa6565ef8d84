"""A container-profile site for tests: a fresh PostgreSQL schema (the execution database) and a fresh
bucket on the session's S3-compatible server, bound through the environment as a deployment binds
them (docs/container-profile.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg

from tests.support.s3_server import CREDENTIALS, S3Server


@dataclass(frozen=True)
class ContainerSite:
    dsn: str
    schema: str
    bucket: str
    """``s3://<bucket>/corpus``."""
    endpoint: str

    @classmethod
    def fresh(cls, dsn: str, schema: str, s3: S3Server) -> ContainerSite:
        return cls(dsn, schema, f"s3://{s3.new_bucket()}/corpus", s3.endpoint)

    @property
    def env(self) -> dict[str, str]:
        return {"CONTEXTFUL_STORAGE_PROFILE": "postgres", "CONTEXTFUL_POSTGRES_DSN": self.dsn,
                "CONTEXTFUL_POSTGRES_SCHEMA": self.schema, "CONTEXTFUL_CORPUS_BUCKET": self.bucket,
                "CONTEXTFUL_S3_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    def child_env(self, tmpdir: str) -> dict[str, str]:
        """A child process's whole environment: no other ``CONTEXTFUL_*`` variable, temp files in ``tmpdir``."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
        return clean | self.env | {"TMPDIR": tmpdir}

    def sql(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run one statement in the site's schema; its rows (none for a statement returning none)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            conn.execute(f'SET search_path TO "{self.schema}"')
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self.sql("SELECT table_name FROM information_schema.tables"
                                            " WHERE table_schema = %s", (self.schema,))}

    def drop(self) -> None:
        self.sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
