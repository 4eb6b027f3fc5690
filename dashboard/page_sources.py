"""Sources: what the dashboard reads (your store, pulled bundles, the results shipped with quantbench), how many runs
each gives, and every bundle pulled: who published it, when, with which quantbench, from where."""

import pandas as pd
import streamlit as st

from dashboard import EMPTY, store_cache

st.title("Sources")
db, mtime = store_cache.current()
found = store_cache.store(db).sources
st.caption("Your runs and shared results are kept apart: `quantbench run`, `demo` and `sweep` write to your store; "
           "`quantbench pull` merges other people's bundles into the pulled store; the results shipped with "
           "quantbench are read as they are. A run found in two of them is read from the first. Switch "
           "**Shared results too** in the sidebar to read your store alone.")
runs = store_cache.runs(db, mtime) if store_cache.status(db, mtime).usable else pd.DataFrame()
by_store = runs.groupby("store").size().to_dict() if len(runs) else {}
rows = [{"Source": s.label, "File": str(s.path), "Made": "yes" if s.path.exists() else "not yet",
         "Runs read from it": int(by_store.get(s.label, 0))} for s in found]
st.dataframe(rows, hide_index=True, width="stretch", placeholder=EMPTY)

bundles = store_cache.bundles(db, mtime)
st.subheader("Bundles pulled")
if bundles.empty:
    st.info("No bundles pulled yet. `quantbench pull URL` (a bundle's folder, .tar or .zip, or its http(s) address) "
            "verifies every file's sha256 and merges it; `quantbench publish` makes one of your runs.", icon="ℹ️")
else:
    st.dataframe(bundles.rename(columns={
        "name": "Bundle", "publisher_host": "Published by", "published_at": "Published", "quantbench_version":
        "quantbench", "quantbench_git_rev": "Commit", "pulled_from": "Pulled from", "pulled_at": "Pulled",
        "runs": "Runs", "runs_added": "Runs it added", "load_runs": "Load runs", "digest": "manifest sha256",
        "store": "Into"}).drop(columns=["bundle_id", "store_path"]), hide_index=True, width="stretch",
        column_config={"Published": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
                       "Pulled": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm")}, placeholder=EMPTY)
if len(runs):
    st.subheader("Runs by source, machine and day")
    table = runs.assign(day=pd.to_datetime(runs["created_at"]).dt.strftime("%Y-%m-%d"))
    st.dataframe(table.groupby(["source", "gpu_label", "day"]).size().reset_index(name="runs").rename(columns={
        "source": "Source", "gpu_label": "GPU / host", "day": "Measured on", "runs": "Runs"}).sort_values(
        ["Source", "Measured on"], ascending=[True, False]), hide_index=True, width="stretch", placeholder=EMPTY)
