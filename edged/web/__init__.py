"""The status page's static files (HTML, CSS, JavaScript), served as they are by
`edged/api/page.py`: no build step, nothing fetched from elsewhere, read-only."""
