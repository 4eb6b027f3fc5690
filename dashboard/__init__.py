"""The Streamlit dashboard: `streamlit run dashboard` (entry dashboard/streamlit_app.py)."""
