"""The Streamlit dashboard: `streamlit run dashboard` (entry dashboard/streamlit_app.py)."""
EMPTY = "—"  # what an empty cell reads as in every table (st.dataframe draws a missing number as "None")
