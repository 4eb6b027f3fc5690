"""The results schema, as ordered migrations. A store at version N gets migrations N+1.. applied in order.

Never edit a released migration: add a new one. `SCHEMA_VERSION` is the number of migrations.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: runs, answers, latencies.
    """
    CREATE TABLE runs (
        run_id UUID PRIMARY KEY,
        status VARCHAR NOT NULL,              -- ok | failed
        failure VARCHAR,                      -- oom | timeout | crashed | load_error | unsupported | error
        error VARCHAR,                        -- message and traceback of a failed run
        created_at TIMESTAMPTZ NOT NULL,
        finished_at TIMESTAMPTZ,
        backend VARCHAR NOT NULL,
        variant VARCHAR,
        weight_format VARCHAR,
        kernel_path VARCHAR,
        compute_dtype VARCHAR,
        native VARCHAR,                       -- native | emulated | NULL
        model_id VARCHAR,
        model_path VARCHAR,
        model_hash VARCHAR,
        model_revision VARCHAR,
        weights VARCHAR,                      -- trained | synthetic | checkpoint
        tokenizer_hash VARCHAR,               -- sha256 of the token ids of every suite prompt; NULL: not seen (http)
        suite_id VARCHAR,
        suite_hash VARCHAR,
        n_records INTEGER,
        n_questions INTEGER,
        device VARCHAR,                       -- cpu | cuda:0 ...
        gpu_name VARCHAR,
        gpu_family VARCHAR,                   -- cpu | ampere | ada | hopper | blackwell | ...
        gpu_uuid VARCHAR,
        gpu_cc VARCHAR,
        gpu_sm_count INTEGER,
        gpu_memory_bytes BIGINT,
        driver_version VARCHAR,
        cuda_version VARCHAR,
        host VARCHAR,
        cpu_model VARCHAR,
        host_memory_bytes BIGINT,
        os VARCHAR,
        python_version VARCHAR,
        torch_version VARCHAR,
        transformers_version VARCHAR,
        auto_round_version VARCHAR,
        modelopt_version VARCHAR,
        quantbench_version VARCHAR,
        quantbench_git_rev VARCHAR,
        load_s DOUBLE,
        cold_ms DOUBLE,                       -- first decision after load (model time)
        mem_weights_bytes BIGINT,             -- device memory allocated by the load (after - before)
        mem_peak_allocated_bytes BIGINT,
        mem_peak_reserved_bytes BIGINT,
        mem_nvml_peak_bytes BIGINT,           -- NVML per-process peak, sampled
        host_rss_peak_bytes BIGINT,
        experts_bytes BIGINT,                 -- MoE expert weights in memory, summed from the tensors
        disk_bytes BIGINT,
        spec JSON,                            -- the full RunSpec
        spec_hash VARCHAR,                    -- hash of the settings that define the result (sweeps skip on it)
        extra JSON
    );
    CREATE TABLE answers (
        run_id UUID NOT NULL,
        record_id VARCHAR NOT NULL,
        benchmark VARCHAR,
        question VARCHAR NOT NULL,
        options VARCHAR[] NOT NULL,
        probs DOUBLE[] NOT NULL,
        top VARCHAR NOT NULL,
        gold VARCHAR,
        method VARCHAR NOT NULL,              -- label_logit | continuation
        truncated BOOLEAN NOT NULL,
        PRIMARY KEY (run_id, record_id, question)
    );
    CREATE TABLE latencies (
        run_id UUID NOT NULL,
        seq INTEGER NOT NULL,                 -- order of the timed decision within the run
        phase VARCHAR NOT NULL,               -- suite | latency
        record_id VARCHAR NOT NULL,
        model_ms DOUBLE NOT NULL,             -- forward pass (CUDA events on GPU, perf_counter on CPU)
        prep_ms DOUBLE NOT NULL,              -- tokenization and tensor building
        tokens INTEGER NOT NULL,
        batch INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """,
    # 2: the role a run plays in parity (reference / noise floor) and the GPU the user asked for.
    """
    ALTER TABLE runs ADD COLUMN role VARCHAR DEFAULT 'candidate';
    ALTER TABLE runs ADD COLUMN gpu_requested VARCHAR;
    """,
    # 3: bytes of every tensor the loaded model holds (parameters and buffers, on any device): the weights figure
    # on a CPU host, where the device-memory columns stay NULL.
    """
    ALTER TABLE runs ADD COLUMN model_tensor_bytes BIGINT;
    """,
    # 4: what a variant's BF16 base is and how that is known (quantbench.models.lineage), so the report pairs variants
    # made elsewhere with their base: base_model_how is quantbench | given | model_card.
    """
    ALTER TABLE runs ADD COLUMN base_model VARCHAR;
    ALTER TABLE runs ADD COLUMN base_model_how VARCHAR;
    ALTER TABLE runs ADD COLUMN shared_tensors_hash VARCHAR;
    """,
    # 5: GPU energy of the timed phase (quantbench.run.energy): NVML's total-energy counter read at the start and end
    # of the whole phase, never per decision; NULL where not measured (CPU, remote server, phase too short), the
    # reason in extra.energy. Idle power is the same counter over an idle second before the phase.
    """
    ALTER TABLE runs ADD COLUMN energy_j_per_decision DOUBLE;
    ALTER TABLE runs ADD COLUMN energy_mean_w DOUBLE;
    ALTER TABLE runs ADD COLUMN energy_phase_s DOUBLE;
    ALTER TABLE runs ADD COLUMN energy_decisions INTEGER;
    ALTER TABLE runs ADD COLUMN energy_idle_w DOUBLE;
    """,
    # 6: load runs of a SystemOne server (`quantbench load`, quantbench.load): one row per run with the server's
    # identity as its /healthz gave it and the generator's machine, one row per step (a concurrency or a rate).
    # Latencies are end to end on the client; queue_*, model_* and mean_batch only where the server reports them.
    """
    CREATE TABLE load_runs (
        load_id UUID PRIMARY KEY,
        created_at TIMESTAMPTZ NOT NULL,
        finished_at TIMESTAMPTZ NOT NULL,
        endpoint VARCHAR NOT NULL,
        mode VARCHAR NOT NULL,                -- closed (a concurrency sweep) | open (Poisson arrivals at rates)
        requests_from VARCHAR NOT NULL,       -- the suite's id, or card-example
        suite_hash VARCHAR,
        n_distinct_requests INTEGER NOT NULL,
        server_model VARCHAR,                 -- from the server's /healthz, where it has one
        server_variant VARCHAR,
        server_kernel_path VARCHAR,
        server_gpu VARCHAR,
        server_health JSON,                   -- the whole /healthz body (NULL: none)
        saturation DOUBLE,                    -- the concurrency or rate of peak throughput, when a later step did not rise past it
        peak_decisions_per_s DOUBLE,
        host VARCHAR NOT NULL,                -- the generator's machine
        cpu_model VARCHAR,
        os VARCHAR,
        python_version VARCHAR,
        quantbench_version VARCHAR,
        quantbench_git_rev VARCHAR,
        settings JSON NOT NULL                -- the generator's settings (steps, bounds, timeout, seed)
    );
    CREATE TABLE load_steps (
        load_id UUID NOT NULL,
        step INTEGER NOT NULL,
        concurrency INTEGER,                  -- closed loop: requests in flight
        rate DOUBLE,                          -- open loop: mean arrivals per second
        sent INTEGER NOT NULL,
        ok INTEGER NOT NULL,
        errors JSON NOT NULL,                 -- {status or transport error: count}
        duration_s DOUBLE NOT NULL,
        offered_per_s DOUBLE NOT NULL,        -- sent / duration
        decisions_per_s DOUBLE NOT NULL,      -- answered (200) / duration
        p50_ms DOUBLE,                        -- end to end on the client, answered requests
        p90_ms DOUBLE,
        p99_ms DOUBLE,
        mean_ms DOUBLE,
        error_p50_ms DOUBLE,                  -- end to end of the refused ones (how fast a 503 came)
        queue_p50_ms DOUBLE,                  -- X-Quantbench-Queue-Ms
        queue_p99_ms DOUBLE,
        model_p50_ms DOUBLE,                  -- the response's model_ms (its batch's forward pass)
        overhead_p50_ms DOUBLE,               -- end to end minus queue and model time, per request
        mean_batch DOUBLE,                    -- X-Quantbench-Batch: requests per forward pass (answered / sum 1/batch)
        client_cpu DOUBLE,                    -- the generator's CPU seconds / wall seconds: near 1, it was the limit
        PRIMARY KEY (load_id, step)
    );
    """,
    # 7: what each answer's decision was about (quantbench.protocol.modality_of: text | image | audio | video |
    # mixed, from the record's media parts), so parity can be judged per modality. Rows stored before it read
    # 'text': their suites had no media until schema 6's engine, and where a pre-7 row's suite did carry media the
    # migration cannot know it (the store keeps no request); re-run such a suite to have it split.
    """
    ALTER TABLE answers ADD COLUMN modality VARCHAR DEFAULT 'text';
    """,
    # 8: result bundles pulled into this store (`quantbench pull`, quantbench.store.bundle): one row per bundle with
    # its manifest as pulled, and one per run or load run it carries, so every row can say where it came from.
    # `added` is false for a run the store already held (measured here, or brought by an earlier bundle): a run's
    # source is the bundle that added it.
    """
    CREATE TABLE bundles (
        bundle_id VARCHAR PRIMARY KEY,        -- the manifest's bundle_id
        digest VARCHAR NOT NULL,              -- sha256 of manifest.json as pulled (it names every file's sha256)
        name VARCHAR,
        published_at TIMESTAMPTZ,
        publisher_host VARCHAR,
        quantbench_version VARCHAR,
        quantbench_git_rev VARCHAR,
        pulled_from VARCHAR NOT NULL,         -- the folder, archive or URL as given to `quantbench pull`
        pulled_at TIMESTAMPTZ NOT NULL,
        manifest JSON NOT NULL
    );
    CREATE TABLE bundle_items (
        bundle_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,                -- run | load_run
        item_id UUID NOT NULL,                -- run_id or load_id
        added BOOLEAN NOT NULL,               -- this pull inserted it (false: the store had it already)
        PRIMARY KEY (bundle_id, kind, item_id)
    );
    """,
    # 9: the figures of issue #35. answers.margin: the answer's own p(top) − p(second) (p(top) with one option), so
    # flips split by BF16's confidence in SQL; rows stored before it get it from their stored probabilities (the
    # child's arithmetic, not an estimate). runs: the run's own peak host memory and how it was read
    # (host_rss_peak_source vmhwm | sampled; NULL on older rows, whose host_rss_peak_bytes is ru_maxrss, which a
    # child inherits from the process that launched it); the machine beyond its host name (cpu_cores: logical
    # CPUs; machine_id: sha256 of /etc/machine-id, 16 hex digits); how busy it was during the timed phase
    # (load_avg_1m at its end, cpu_steal_share and cpu_others_share: /proc/stat over the phase, the others' share
    # net of the run's own CPU time); the runs of one `run --repeat N` (repeat_id, repeat_index from 1,
    # repeat_count). NULL where not measured, never guessed.
    """
    ALTER TABLE answers ADD COLUMN margin DOUBLE;
    UPDATE answers SET margin = list_sort(probs, 'DESC')[1] - coalesce(list_sort(probs, 'DESC')[2], 0.0);
    ALTER TABLE runs ADD COLUMN host_rss_peak_source VARCHAR;
    ALTER TABLE runs ADD COLUMN cpu_cores INTEGER;
    ALTER TABLE runs ADD COLUMN machine_id VARCHAR;
    ALTER TABLE runs ADD COLUMN load_avg_1m DOUBLE;
    ALTER TABLE runs ADD COLUMN cpu_steal_share DOUBLE;
    ALTER TABLE runs ADD COLUMN cpu_others_share DOUBLE;
    ALTER TABLE runs ADD COLUMN repeat_id VARCHAR;
    ALTER TABLE runs ADD COLUMN repeat_index INTEGER;
    ALTER TABLE runs ADD COLUMN repeat_count INTEGER;
    """,
]

# Views are recreated on every open (they hold no data), so they can change without a migration.
VIEWS = """
CREATE OR REPLACE VIEW run_latency AS
SELECT run_id,
       count(*) AS n_timed,
       quantile_cont(model_ms, 0.5) AS p50_ms,
       quantile_cont(model_ms, 0.9) AS p90_ms,
       quantile_cont(model_ms, 0.99) AS p99_ms,
       avg(model_ms) AS mean_ms,
       avg(prep_ms) AS prep_mean_ms,
       avg(tokens) AS mean_tokens
FROM latencies GROUP BY run_id;

CREATE OR REPLACE VIEW run_accuracy AS
-- One accuracy everywhere (quantbench.analysis.stats.ACCURACY_NAME): the unweighted mean over benchmarks of each
-- benchmark's accuracy on its questions with a gold answer, as the report's reference accuracy and Δ accuracy.
WITH per_benchmark AS (
    SELECT run_id, coalesce(benchmark, '(none)') AS benchmark, count(*) AS n, count(gold) AS n_gold,
           avg(CASE WHEN gold IS NOT NULL THEN (top = gold)::INTEGER END) AS accuracy
    FROM answers GROUP BY ALL)
SELECT run_id, sum(n)::BIGINT AS n_answers, sum(n_gold)::BIGINT AS n_gold, avg(accuracy) AS accuracy
FROM per_benchmark GROUP BY run_id;

CREATE OR REPLACE VIEW run_summary AS
SELECT r.run_id, r.created_at, r.status, r.failure, r.backend, r.variant, r.role, r.weight_format, r.kernel_path,
       r.native, r.model_id, r.weights, r.suite_id, r.device, r.gpu_name, r.gpu_family, r.host,
       r.n_records, r.n_questions, a.accuracy, a.n_gold, l.p50_ms, l.p90_ms, l.p99_ms, l.n_timed,
       r.load_s, r.cold_ms, r.mem_weights_bytes, r.mem_peak_allocated_bytes, r.mem_nvml_peak_bytes,
       r.host_rss_peak_bytes, r.experts_bytes, r.model_tensor_bytes, r.disk_bytes
FROM runs r
LEFT JOIN run_accuracy a USING (run_id)
LEFT JOIN run_latency l USING (run_id);
"""

# Where each run of one store came from: the bundle that added it (schema 8). Not one of VIEWS, which an older
# store's own quantbench made without the bundle tables; quantbench.store.composite defines `run_source` over
# several stores, with the store each run is read from.
RUN_SOURCE = """
SELECT i.item_id AS run_id, NULL::VARCHAR AS store, NULL::VARCHAR AS store_kind, b.bundle_id, b.name AS bundle,
       b.publisher_host AS bundle_host, b.published_at AS bundle_published_at, b.pulled_from, b.pulled_at
FROM bundle_items i JOIN bundles b USING (bundle_id)
WHERE i.kind = 'run' AND i.added
"""

SCHEMA_VERSION = len(MIGRATIONS)
RUN_STATUSES = ("ok", "failed")  # a run is stored whole, as one of these (run.record.RunRecord.status)
