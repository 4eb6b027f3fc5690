"""quantbench dashboard: `streamlit run dashboard` (the store: env QUANTBENCH_DB, else your own store with the shared
results beside it; quantbench.store.home)."""

import sys
from pathlib import Path

# `streamlit run dashboard` puts only dashboard/ on sys.path; the pages import the `dashboard` package.
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import streamlit as st  # noqa: E402

from dashboard import EMPTY, store_cache, url_state  # noqa: E402

st.set_page_config(page_title="quantbench", page_icon=":material/balance:", layout="wide")

with st.sidebar:
    store_cache.shared_switch()  # before the store is read: it says which stores that is
db, mtime = store_cache.current(fresh=True)  # one state of the store for this whole run
status = store_cache.status(db, mtime)
# A store of only `quantbench load` runs opens on the load page: it is the one page with something to show.
load_first = status.only_load_runs
LOAD_TITLE = "Serving under load"
page = st.navigation([
    st.Page("page_report.py", title="Which quant should I use?", icon=":material/star:", default=not load_first),
    st.Page("page_latency.py", title="Latency", icon=":material/timer:", url_path="latency"),
    st.Page("page_parity.py", title="Parity detail", icon=":material/compare_arrows:", url_path="parity"),
    st.Page("page_constraints.py", title="Constraints", icon=":material/tune:", url_path="constraints"),
    st.Page("page_load.py", title=LOAD_TITLE, icon=":material/speed:", url_path="load", default=load_first),
    st.Page("page_runs.py", title="Runs", icon=":material/list:", url_path="runs"),
    st.Page("page_sources.py", title="Sources", icon=":material/hub:", url_path="sources"),
])

with st.sidebar:
    st.caption(store_cache.sources_caption(db))
if status.only_load_runs:
    with st.sidebar:
        st.caption(f"{status.n_load_runs} load run{'s' * (status.n_load_runs != 1)}, no benchmark runs")
    if page.title == LOAD_TITLE:  # (the default page's url_path is "", whichever it is)
        page.run()
    else:
        st.title(page.title)
        st.info(status.message, icon="ℹ️")
        st.page_link("page_load.py", label=LOAD_TITLE, icon=":material/speed:")
    st.stop()
if not status.usable:
    if page.url_path == "sources":  # what is read, and why it cannot be used, is that page's subject
        page.run()
        st.stop()
    st.title(page.title)
    st.info(status.message, icon="ℹ️")
    st.stop()

runs = store_cache.runs(db, mtime)
with st.sidebar:
    since = url_state.since_input(runs)
    st.session_state["_selection"] = url_state.sidebar(store_cache.runs_since(runs, since), since,
                                                        this_machine=store_cache.this_machine_id())
    # counted from the very table the pages read (status counted in another query: a run written between them
    # made the sidebar and the Runs page differ)
    st.caption(f"{len(runs)} run{'' if len(runs) == 1 else 's'}, {int((runs['status'] == 'ok').sum())} successful; "
               f"newest {runs['created_at'].max():%Y-%m-%d %H:%M}")
sel = url_state.selection()
for miss in url_state.link_misses():  # a shared link naming a GPU or model this store has no runs of
    st.warning(miss, icon="🔗")
if sel.model is None and page.url_path not in ("runs", "load", "sources", "constraints"):
    # Every run on this machine died before loading a model (no model id): there is nothing to compare, only
    # failures to show. The Runs page lists them with their whole error.
    st.title(page.title)
    st.warning(f"Every run on {sel.gpu_label} failed before loading a model, so there is nothing to compare there "
               "yet. The reasons are below (the whole error on the Runs page); fix them and run again.", icon="⚠️")
    here = store_cache.runs_since(runs, sel.since)
    failed = here.loc[here["gpu_id"] == sel.gpu, ["created_at", "gpu_label", "backend", "variant", "failure", "error"]]
    failed = failed.assign(error=failed["error"].fillna("").str.split("\n").str[0])
    st.dataframe(failed.iloc[::-1], hide_index=True, width="stretch", placeholder=EMPTY)
    st.stop()
page.run()
